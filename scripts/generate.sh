#!/usr/bin/env bash
# Regenerates the protobuf code under proto/ with the generators pinned in
# tools/go.mod. The output is byte-identical on every machine.
set -euo pipefail
cd "$(dirname "$0")/.."
go tool -modfile=tools/go.mod buf generate
