package redisstore

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The tests start redis-servers of their own (single nodes, replicas,
// Sentinels, small Clusters) on loopback ports chosen at run time, never
// on fixed ones: two runs of the suite at once on one machine (two
// checkouts, two developers, CI and a developer) must not meet on a port.
// Both test packages (redisstore and redisstore_test) take their ports
// from here, through OwnPortForTest and StartOnPortForTest, so that two
// tests of one process never get the same port.

// ownPorts holds the ports handed out in this process, and each one's
// port+10000.
var ownPorts struct {
	sync.Mutex
	taken map[int]bool
}

// sharedPort reports whether p belongs to the shared test topology: the
// single Redis, the primary/replica pair and the Cluster (with its bus
// ports), which other tests and other runs use.
func sharedPort(p int) bool {
	switch {
	case p == 6379, p == 6390, p == 6391:
		return true
	case 7301 <= p && p <= 7304, 17301 <= p && p <= 17304:
		return true
	}
	return false
}

// ownPort returns a loopback port that was free when asked, whose
// port+10000 (a Cluster node's default bus port) was free too, and that no
// other caller in this process got, as a port or as a bus port. Another
// process may still take it before a server binds it: startOnPort tries
// again then.
func ownPort(t testing.TB) int {
	t.Helper()
	ownPorts.Lock()
	defer ownPorts.Unlock()
	if ownPorts.taken == nil {
		ownPorts.taken = map[int]bool{}
	}
	for range 200 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("no loopback port: %v", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		ok := p+10000 <= 65535 && !sharedPort(p) && !sharedPort(p+10000) && !ownPorts.taken[p] && !ownPorts.taken[p+10000]
		if ok {
			bus, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+10000))
			if err == nil {
				_ = bus.Close()
			}
			ok = err == nil
		}
		_ = l.Close()
		if ok {
			ownPorts.taken[p], ownPorts.taken[p+10000] = true, true
			return p
		}
	}
	t.Fatal("no free loopback port whose port+10000 was free too")
	return 0
}

// startOnPort starts bin with the arguments args gives for a port, and
// waits until the server at 127.0.0.1:port answers INFO with the process ID
// of the one it started (a Sentinel does too). With port 0 it takes the port
// from ownPort, and when the process ends before it answers — it could not
// bind the port or its Cluster bus port, which another process took after
// ownPort's check — it tries again on another port, up to 5 times. With a
// port given (a restart behind the same address) it tries that one only.
// It returns the port, the process and a channel closed when the process
// has ended (after its only Wait); the caller stops the process.
func startOnPort(t testing.TB, bin string, port int, args func(port int) []string) (int, *exec.Cmd, <-chan struct{}) {
	t.Helper()
	tries, fixed := 5, port != 0
	if fixed {
		tries = 1
	}
	var failure string
	for range tries {
		p := port
		if !fixed {
			p = ownPort(t)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", p)
		cmd := exec.Command(bin, args(p)...)
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting %s on %s: %v", bin, addr, err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		probe := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		gone, own := false, false
		tableEventually(10*time.Second, func() bool {
			select {
			case <-exited:
				gone = true
				return true
			default:
			}
			info := probe.InfoMap(context.Background(), "server")
			own = info.Err() == nil && info.Item("Server", "process_id") == fmt.Sprint(cmd.Process.Pid)
			return own
		})
		_ = probe.Close()
		if own {
			return p, cmd, exited
		}
		_ = cmd.Process.Kill()
		<-exited
		if !gone {
			t.Fatalf("the redis-server of the test's own answering at %s: not within 10s", addr)
		}
		failure = fmt.Sprintf("the redis-server of the test's own at %s ended before it answered (%v): the port was taken", addr, cmd.ProcessState)
	}
	t.Fatal(failure)
	return 0, nil, nil
}

// OwnPortForTest and StartOnPortForTest give the tests of package
// redisstore_test ownPort and startOnPort, and so the same set of ports
// handed out.
var (
	OwnPortForTest     = ownPort
	StartOnPortForTest = startOnPort
)
