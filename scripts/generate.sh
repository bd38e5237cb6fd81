#!/usr/bin/env bash
# Regenerates the protobuf code with the generators pinned in tools/go.mod,
# once per buf module so that each module's code lands beside its .proto
# files. The output is byte-identical on every machine.
set -euo pipefail
cd "$(dirname "$0")/.."
for module in proto internal/testproto examples/quickstart/proto examples/relay/proto examples/ledger/proto; do
  go tool -modfile=tools/go.mod buf generate "$module" -o "$module"
done
