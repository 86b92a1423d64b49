// Package redistest starts real redis-server processes for tests: one node
// (optionally with a password or an ACL user) or a three-master cluster
// made with `redis-cli --cluster create`. Every server listens on
// 127.0.0.1 only, on a free port, in a temporary directory, and is killed
// and waited for by t.Cleanup. When redis-server is not installed the test
// is skipped with a message saying how to install it, and its name is
// appended to the file named by $OMNICACHE_REDIS_SKIPS (make test lists
// them); under CI (env CI set) it fails instead: the Redis tests must run
// there (.ci/redis.sh installs it).
package redistest

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Server is one running redis-server.
type Server struct {
	Addr   string // 127.0.0.1:PORT
	Port   int
	cmd    *exec.Cmd
	pass   string
	dead   bool
	tls    bool
	exited chan struct{}
}

// Need returns the paths of redis-server and redis-cli, skipping the test
// when they are missing (failing it under CI).
func Need(t testing.TB) (server, cli string) {
	t.Helper()
	s, err1 := exec.LookPath("redis-server")
	c, err2 := exec.LookPath("redis-cli")
	if err1 != nil || err2 != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server/redis-cli not installed (CI is set: the Redis tests must run; .ci/redis.sh installs them): %v %v", err1, err2)
		}
		noteSkip(t.Name())
		t.Skip("redis-server not installed: run `sudo apt-get install redis-server` (or `make redis`)")
	}
	return s, c
}

// SkipsEnv names the environment variable `make test` sets to a file:
// every test skipped for want of redis-server appends its name there, so
// that a run without Redis ends by listing them instead of passing quietly
// (go test prints no skips without -v).
const SkipsEnv = "OMNICACHE_REDIS_SKIPS"

func noteSkip(name string) {
	path := os.Getenv(SkipsEnv)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	fmt.Fprintln(f, name) // one short O_APPEND write: whole lines from parallel test binaries
	f.Close()
}

// freePort returns a loopback port nothing listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Options configure Start.
type Options struct {
	Password  string   // requirepass (the default user)
	ACL       []string // extra ACL SETUSER rules, e.g. "omni on >pw ~* +@all"
	MaxMemory string   // e.g. "2mb": with maxmemory-policy allkeys-lru
	Cluster   bool     // cluster-enabled (a node of a cluster StartCluster makes)
	// TLSCert and TLSKey (PEM files) make the server speak TLS only, on
	// the port (no client certificates).
	TLSCert, TLSKey string
	Args            []string
}

// Start runs one redis-server and waits until it answers PING (bounded).
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	bin, _ := Need(t)
	for try := 0; ; try++ {
		s, err := start(t, bin, o)
		if err == nil {
			return s
		}
		if try == 4 {
			t.Fatalf("redistest: redis-server would not start: %v", err)
		}
	}
}

func start(t testing.TB, bin string, o Options) (*Server, error) {
	dir := t.TempDir()
	port := freePort(t)
	portArgs := []string{"--port", strconv.Itoa(port)}
	if o.TLSCert != "" {
		portArgs = []string{"--port", "0", "--tls-port", strconv.Itoa(port), "--tls-cert-file", o.TLSCert,
			"--tls-key-file", o.TLSKey, "--tls-auth-clients", "no"}
	}
	args := []string{"--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "yes", "--loglevel", "warning",
		"--logfile", filepath.Join(dir, "redis.log")}
	if o.Password != "" {
		args = append(args, "--requirepass", o.Password)
	}
	for _, rule := range o.ACL {
		args = append(args, "--user")
		args = append(args, strings.Fields(rule)...)
	}
	if o.MaxMemory != "" {
		args = append(args, "--maxmemory", o.MaxMemory, "--maxmemory-policy", "allkeys-lru", "--maxmemory-samples", "10")
	}
	if o.Cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no")
	}
	args = append(append(args, portArgs...), o.Args...)
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Port: port, cmd: cmd, pass: o.Password, tls: o.TLSCert != ""}
	t.Cleanup(s.Kill)
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.exited = exited
	for i := 0; i < 400; i++ { // bounded: 400 × 10 ms
		if s.ping() {
			return s, nil
		}
		select {
		case <-exited:
			s.dead = true
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			return nil, fmt.Errorf("exited: %s", strings.TrimSpace(string(log)))
		case <-time.After(10 * time.Millisecond):
		}
	}
	s.Kill()
	return nil, fmt.Errorf("no answer on %s", s.Addr)
}

// ping sends a PING (AUTH first when the server has a password, as a RESP
// array: an inline command would split a password holding quotes).
func (s *Server) ping() bool {
	d := &net.Dialer{Timeout: 200 * time.Millisecond}
	var c net.Conn
	var err error
	if s.tls {
		c, err = tls.DialWithDialer(d, "tcp", s.Addr, &tls.Config{InsecureSkipVerify: true}) // the test's own server, probed for liveness only
	} else {
		c, err = d.Dial("tcp", s.Addr)
	}
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	r := bufio.NewReader(c)
	if s.pass != "" {
		fmt.Fprintf(c, "*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n", len(s.pass), s.pass)
		if l, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(l, "+OK") {
			return false
		}
	}
	fmt.Fprintf(c, "PING\r\n")
	l, err := r.ReadString('\n')
	return err == nil && strings.HasPrefix(l, "+PONG")
}

// Kill stops the server (SIGKILL) and waits until it exited (bounded). Safe to call twice.
func (s *Server) Kill() {
	if s.dead {
		return
	}
	s.dead = true
	_ = s.cmd.Process.Kill()
	select { // the waiter reaps it; bounded
	case <-s.exited:
	case <-time.After(10 * time.Second):
	}
}

// Pause stops the server (SIGSTOP) without closing its connections: a
// hung server, whose clients' requests wait until their deadlines.
func (s *Server) Pause(t testing.TB) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("redistest: pause: %v", err)
	}
	t.Cleanup(func() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }) // Kill needs it running
}

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume(t testing.TB) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("redistest: resume: %v", err)
	}
}

// Cli runs redis-cli against the server and returns its output.
func (s *Server) Cli(t testing.TB, args ...string) string {
	t.Helper()
	_, cli := Need(t)
	base := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(s.Port)}
	if s.tls {
		base = append(base, "--tls", "--insecure")
	}
	if s.pass != "" {
		base = append(base, "--no-auth-warning", "-a", s.pass)
	}
	out, err := exec.Command(cli, append(base, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// Cluster is three masters (no replicas) covering every slot.
type Cluster struct {
	Nodes []*Server
}

// Addrs are the nodes' addresses.
func (c *Cluster) Addrs() []string {
	a := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		a[i] = n.Addr
	}
	return a
}

// Spec is the cluster as a tier spec (redis-cluster://H1:P1,...).
func (c *Cluster) Spec() string { return "redis-cluster://" + strings.Join(c.Addrs(), ",") }

// StartCluster runs three cluster-enabled nodes and joins them with
// `redis-cli --cluster create --cluster-yes`, then waits (bounded) until
// every node reports cluster_state:ok.
func StartCluster(t testing.TB, o Options) *Cluster {
	t.Helper()
	_, cli := Need(t)
	o.Cluster = true
	c := &Cluster{}
	for i := 0; i < 3; i++ {
		c.Nodes = append(c.Nodes, Start(t, o))
	}
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if o.Password != "" {
		args = append(args, "--no-auth-warning", "-a", o.Password)
	}
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v: %s", err, out)
	}
	for i := 0; i < 500; i++ { // bounded: 500 × 20 ms
		ok := true
		for _, n := range c.Nodes {
			if !strings.Contains(n.Cli(t, "cluster", "info"), "cluster_state:ok") {
				ok = false
				break
			}
		}
		if ok {
			return c
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("redistest: the cluster never reached cluster_state:ok")
	return nil
}
