//go:build linux

package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/denhq/den/agent"
)

// Port is a virtio-serial port seen from the guest: one byte stream that
// hosts connect to and disconnect from over time. Read returns io.EOF (or
// 0 bytes) while no host is connected and blocks while one is connected
// but silent; Write blocks while no host is connected. Close interrupts
// both. /dev/vportNpM opened by OpenSerialPort behaves so.
type Port interface {
	io.ReadWriteCloser
}

// PollInterval is how often ServePort looks for a host while none is
// connected (a virtio-serial port reports EOF at once then, so it cannot
// be waited on).
const PollInterval = 20 * time.Millisecond

// maxConnBuffer bounds what a connection has received but not yet read
// before the port reader waits for it (SSH flow control keeps it small).
const maxConnBuffer = 4 << 20

// ErrNoPort is wrapped when no virtio-serial port has the wanted name.
var ErrNoPort = errors.New("no such virtio-serial port")

// OpenSerialPort opens the virtio-serial port named name
// (/sys/class/virtio-ports/vport*/name) read-write.
func OpenSerialPort(sysDir, name string) (*os.File, error) {
	ents, err := os.ReadDir(sysDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("open serial port %s: %w", name, err)
	}
	for _, e := range ents {
		n, err := os.ReadFile(filepath.Join(sysDir, e.Name(), "name"))
		if err != nil || strings.TrimSpace(string(n)) != name {
			continue
		}
		f, err := os.OpenFile(filepath.Join("/dev", e.Name()), os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("open serial port %s: %w", name, err)
		}
		return f, nil
	}
	return nil, fmt.Errorf("open serial port %s: %w", name, ErrNoPort)
}

// ServePort serves SSH over p as a sequence of connections until ctx ends
// or p fails; it closes p. Every SSH version line from the host starts a
// new connection and ends the current one (a host that reconnected after
// a restore without the guest seeing it leave); EOF (no host) ends the
// current one. Bytes before a version line are dropped.
func (s *Server) ServePort(ctx context.Context, p Port) error {
	d := &demux{s: s, port: p}
	stop := context.AfterFunc(ctx, func() { p.Close() })
	defer stop()
	defer p.Close()
	err := d.run(ctx)
	d.endCur()
	return err
}

type demux struct {
	s    *Server
	port Port
	wmu  sync.Mutex    // serializes writes to the port
	gen  atomic.Uint64 // generation of the connection allowed to write
	cur  *portConn
	scan []byte // looking for a version line (no current connection)
	tail []byte // last bytes given to cur, for a line split across reads
}

func (d *demux) run(ctx context.Context) error {
	buf := make([]byte, 64<<10)
	for {
		n, err := d.port.Read(buf)
		if n > 0 {
			d.feed(buf[:n])
		}
		if ctx.Err() != nil || d.s.closing.Load() {
			return nil
		}
		if err == nil && n > 0 {
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			if errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			d.endCur()
			return fmt.Errorf("serial port: %w", err)
		}
		// No host connected.
		if d.cur != nil {
			d.s.log.Info("host disconnected from the serial port")
			d.endCur()
		}
		d.scan = nil
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(PollInterval):
		}
	}
}

// feed routes bytes read from the port.
func (d *demux) feed(data []byte) {
	magic := []byte(agent.VersionMagic)
	for len(data) > 0 {
		if d.cur == nil {
			d.scan = append(d.scan, data...)
			data = d.startFromScan()
			continue
		}
		// A version line split between the tail and data? (The tail is
		// shorter than the magic, so a match there reaches into data.)
		k := min(len(data), len(magic)-1)
		edge := append(append([]byte(nil), d.tail...), data[:k]...)
		if i := bytes.Index(edge, magic); i >= 0 {
			data = append(append([]byte(nil), d.tail[i:]...), data...)
			d.endCur()
			continue
		}
		if i := bytes.Index(data, magic); i >= 0 {
			data = data[i:]
			d.endCur()
			continue
		}
		d.cur.deliver(data)
		t := append(append(make([]byte, 0, 2*len(magic)), d.tail...), data[max(0, len(data)-len(magic)):]...)
		d.tail = lastN(t, len(magic)-1)
		return
	}
}

// startFromScan starts a connection once scan holds a whole version line,
// and returns the bytes after it.
func (d *demux) startFromScan() []byte {
	magic := []byte(agent.VersionMagic)
	for {
		i := bytes.Index(d.scan, magic)
		if i < 0 {
			d.scan = append([]byte(nil), lastN(d.scan, len(magic)-1)...)
			return nil
		}
		d.scan = d.scan[i:]
		j := bytes.IndexByte(d.scan, '\n')
		if j < 0 && len(d.scan) <= 255 {
			return nil // wait for the rest of the line
		}
		if j < 0 || j >= 255 {
			d.scan = d.scan[1:] // not a version line
			continue
		}
		line, rest := d.scan[:j+1], append([]byte(nil), d.scan[j+1:]...)
		// An aborted version line right before a whole one.
		if k := bytes.LastIndex(line, magic); k > 0 {
			line = line[k:]
		}
		d.scan = nil
		d.start(line)
		return rest
	}
}

func (d *demux) start(line []byte) {
	c := &portConn{d: d, gen: d.gen.Add(1)}
	c.cond = sync.NewCond(&c.mu)
	c.deliver(line)
	d.cur = c
	d.tail = append([]byte(nil), lastN(line, len(agent.VersionMagic)-1)...)
	d.s.log.Info("host connected on the serial port", "client", strings.TrimSpace(string(line)))
	go d.s.HandleConn(c)
}

// endCur ends the current connection: it reads EOF and can no longer
// write.
func (d *demux) endCur() {
	d.gen.Add(1)
	if d.cur != nil {
		d.cur.endRead()
		d.cur = nil
	}
	d.tail = nil
}

func lastN(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// portConn is one SSH connection on the port.
type portConn struct {
	d   *demux
	gen uint64

	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte
	eof    bool
	closed bool
}

func (c *portConn) deliver(p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.buf) > maxConnBuffer && !c.eof && !c.closed {
		c.cond.Wait()
	}
	if !c.eof && !c.closed {
		c.buf = append(c.buf, p...)
		c.cond.Broadcast()
	}
}

func (c *portConn) endRead() {
	c.mu.Lock()
	c.eof = true
	c.cond.Broadcast()
	c.mu.Unlock()
}

func (c *portConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.buf) == 0 && !c.eof && !c.closed {
		c.cond.Wait()
	}
	if c.closed {
		return 0, net.ErrClosed
	}
	if len(c.buf) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	if len(c.buf) == 0 {
		c.buf = nil
	}
	c.cond.Broadcast()
	return n, nil
}

// Write writes to the port while this is the current connection; a
// connection that has ended must not put bytes into the next one's
// stream.
func (c *portConn) Write(p []byte) (int, error) {
	c.d.wmu.Lock()
	defer c.d.wmu.Unlock()
	c.mu.Lock()
	dead := c.closed || c.eof
	c.mu.Unlock()
	if dead || c.d.gen.Load() != c.gen {
		return 0, net.ErrClosed
	}
	return c.d.port.Write(p)
}

func (c *portConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.cond.Broadcast()
	c.mu.Unlock()
	return nil
}

func (c *portConn) LocalAddr() net.Addr                { return portAddr{} }
func (c *portConn) RemoteAddr() net.Addr               { return portAddr{} }
func (c *portConn) SetDeadline(t time.Time) error      { return nil }
func (c *portConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *portConn) SetWriteDeadline(t time.Time) error { return nil }

type portAddr struct{}

func (portAddr) Network() string { return "virtio-serial" }
func (portAddr) String() string  { return agent.SerialPortName }
