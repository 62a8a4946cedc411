package cloudhypervisor

import (
	"encoding/json"
	"fmt"
	"github.com/denhq/den/vmm"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as a fake cloud-hypervisor, so that Start,
// Adopt and Shutdown run against a real process (own session, PID file,
// SIGTERM and SIGKILL): started with --api-socket path=SOCK, it reads
// fake.json beside SOCK and acts as told there. With DEN_CH_FAKE=version
// (or version-hang) in its environment it answers --version.

// fakeConfig is fake.json.
type fakeConfig struct {
	// Mode: "replay" serves Entries on the socket; "exit" fails at once;
	// "nosocket" runs without ever listening.
	Mode    string  `json:"mode"`
	Ping    entry   `json:"ping"`
	Entries []entry `json:"entries"`
	// CrashOn ("PUT /api/v1/vm.pause") makes the process exit when that
	// request comes, without answering it.
	CrashOn string `json:"crash_on,omitempty"`
	// IgnoreTerm ignores SIGTERM; StayAfterShutdown keeps running after
	// answering vmm.shutdown. Together they need SIGKILL.
	IgnoreTerm        bool `json:"ignore_term,omitempty"`
	StayAfterShutdown bool `json:"stay_after_shutdown,omitempty"`
}

// fakeLifetime bounds a fake process whatever happens to the test.
const fakeLifetime = 2 * time.Minute

func TestMain(m *testing.M) {
	vmm.RunShim() // the launcher of the confined real-binary test on cgroup v1
	switch os.Getenv("DEN_CH_FAKE") {
	case "version":
		fmt.Println("cloud-hypervisor v53.0")
		fmt.Println("Migration Protocol Versions: 0")
		os.Exit(0)
	case "version-hang":
		time.Sleep(fakeLifetime)
		os.Exit(1)
	}
	if sock := apiSocketArg(os.Args[1:]); sock != "" {
		os.Exit(runFake(sock))
	}
	os.Exit(m.Run())
}

// apiSocketArg finds "--api-socket path=SOCK" among the arguments.
func apiSocketArg(args []string) string {
	for i, a := range args {
		if a == "--api-socket" && i+1 < len(args) {
			if p, ok := strings.CutPrefix(args[i+1], "path="); ok {
				return p
			}
		}
	}
	return ""
}

// runFake is the fake cloud-hypervisor's main.
func runFake(sock string) int {
	time.AfterFunc(fakeLifetime, func() { os.Exit(4) })
	data, err := os.ReadFile(filepath.Join(filepath.Dir(sock), "fake.json"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor:", err)
		return 2
	}
	var cfg fakeConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor: fake.json:", err)
		return 2
	}
	fmt.Fprintf(os.Stderr, "fake cloud-hypervisor: pid %d, mode %s\n", os.Getpid(), cfg.Mode)
	if cfg.IgnoreTerm {
		signal.Ignore(syscall.SIGTERM)
	}
	switch cfg.Mode {
	case "exit":
		fmt.Fprintln(os.Stderr, "Error: cannot open /dev/kvm: simulated failure")
		return 1
	case "nosocket":
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor: never opening the api socket")
		time.Sleep(fakeLifetime)
		return 3
	}
	r := newReplay(cfg.Ping, cfg.Entries)
	r.crashOn = cfg.CrashOn
	r.crash = func() {
		fmt.Fprintf(os.Stderr, "thread 'vmm' panicked: simulated crash on %s\n", cfg.CrashOn)
		os.Exit(101)
	}
	exit := make(chan struct{})
	r.afterShutdown = func() {
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor: vmm.shutdown answered")
		if !cfg.StayAfterShutdown {
			close(exit)
		}
	}
	stop, err := serveReplay(sock, r)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor:", err)
		return 2
	}
	<-exit
	stop()
	return 0
}
