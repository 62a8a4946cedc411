package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// qmpError is an error QEMU answered to a command.
type qmpError struct {
	Command string
	Class   string `json:"class"`
	Desc    string `json:"desc"`
}

func (e *qmpError) Error() string {
	return fmt.Sprintf("qmp %s: %s: %s", e.Command, e.Class, e.Desc)
}

// qmpConn is one QMP session: greeting read, capabilities negotiated.
// QEMU's QMP socket serves one client at a time, so den opens a session
// per operation and closes it after, leaving the socket free.
type qmpConn struct {
	conn net.Conn
	r    *bufio.Reader
	id   int
}

// dialQMP connects to the QMP socket and negotiates capabilities, within
// ctx.
func dialQMP(ctx context.Context, path string) (*qmpConn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	q := &qmpConn{conn: conn, r: bufio.NewReader(conn)}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	// Unblock reads when ctx is cancelled.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	var greeting struct {
		QMP json.RawMessage `json:"QMP"`
	}
	line, err := q.r.ReadBytes('\n')
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("read qmp greeting: %w", err)
	}
	if err := json.Unmarshal(line, &greeting); err != nil || greeting.QMP == nil {
		conn.Close()
		return nil, fmt.Errorf("not a qmp greeting: %q", line)
	}
	if _, err := q.execute(ctx, "qmp_capabilities", nil); err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

// execute runs one command and returns its "return" value, skipping the
// asynchronous events that QEMU interleaves.
func (q *qmpConn) execute(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	return q.executeFD(ctx, cmd, args, nil)
}

// executeFD is execute with f passed along (SCM_RIGHTS), for getfd.
func (q *qmpConn) executeFD(ctx context.Context, cmd string, args any, f *os.File) (json.RawMessage, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = q.conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = q.conn.SetDeadline(time.Now()) })
	defer stop()
	q.id++
	req := map[string]any{"execute": cmd, "id": q.id}
	if args != nil {
		req["arguments"] = args
	}
	data, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	data = append(data, '\n')
	if f != nil {
		uc, ok := q.conn.(*net.UnixConn)
		if !ok {
			return nil, fmt.Errorf("qmp %s: cannot pass an fd over %T", cmd, q.conn)
		}
		_, _, err = uc.WriteMsgUnix(data, unix.UnixRights(int(f.Fd())), nil)
	} else {
		_, err = q.conn.Write(data)
	}
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, ctxErr(ctx, err))
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, ctxErr(ctx, err))
		}
		var resp struct {
			Event  string          `json:"event"`
			ID     int             `json:"id"`
			Return json.RawMessage `json:"return"`
			Error  *qmpError       `json:"error"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return nil, fmt.Errorf("qmp %s: bad reply %q: %w", cmd, line, err)
		}
		if resp.Event != "" || resp.ID != q.id {
			continue
		}
		if resp.Error != nil {
			resp.Error.Command = cmd
			return nil, resp.Error
		}
		return resp.Return, nil
	}
}

func (q *qmpConn) close() error { return q.conn.Close() }

// ctxErr prefers the context's error over the I/O error it caused.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return errors.Join(ctx.Err(), err)
	}
	return err
}
