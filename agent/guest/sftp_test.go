//go:build linux

package guest

import (
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// An sftp session that the client ends (EOF) ends with exit status 0
// before the channel closes, as with OpenSSH's sftp-server: scp and sftp
// fail without it.
func TestSFTPExitStatus(t *testing.T) {
	h := newHarness(t)
	c := h.dial()
	ch, reqs, err := c.SSH().OpenChannel("session", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if ok, err := ch.SendRequest("subsystem", true, gossh.Marshal(struct{ Name string }{"sftp"})); !ok || err != nil {
		t.Fatalf("subsystem sftp: %v %v", ok, err)
	}
	ch.CloseWrite()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case req, ok := <-reqs:
			if !ok {
				t.Fatal("channel closed without an exit status")
			}
			if req.Type == "exit-status" {
				var st struct{ Status uint32 }
				if err := gossh.Unmarshal(req.Payload, &st); err != nil || st.Status != 0 {
					t.Fatalf("exit status %d (%v)", st.Status, err)
				}
				return
			}
		case <-timeout:
			t.Fatal("no exit status within 10s")
		}
	}
}
