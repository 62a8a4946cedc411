package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/validate"
)

// ExecInput runs a command in a VM.
type ExecInput struct {
	Name           string   `json:"name" jsonschema:"the VM's name"`
	Command        string   `json:"command" jsonschema:"a shell command line, run by the guest's shell as root, e.g. cd /src && make test"`
	Env            []string `json:"env,omitempty" jsonschema:"extra environment, KEY=VALUE each"`
	Workdir        string   `json:"workdir,omitempty" jsonschema:"working directory (default: root's home)"`
	Stdin          string   `json:"stdin,omitempty" jsonschema:"text given to the command on stdin (at most 1 MiB)"`
	TimeoutSeconds int      `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds: 1 to 600 (default 60)"`
	MaxOutputBytes int      `json:"max_output_bytes,omitempty" jsonschema:"keep at most this many bytes of each of stdout and stderr: 1 to 1048576 (default 65536)"`
}

// ExecOutput is how a command ended and what it wrote.
type ExecOutput struct {
	// ExitStatus is the command's own, 128+n when signal n killed it,
	// -1 when it timed out.
	ExitStatus int    `json:"exit_status"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	// StdoutBytes and StderrBytes count all it wrote; Truncated says
	// that more than the cap was written.
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
	Truncated   bool  `json:"truncated,omitempty"`
	TimedOut    bool  `json:"timed_out,omitempty"`
}

// ReadFileInput reads a file of a VM.
type ReadFileInput struct {
	Name     string `json:"name" jsonschema:"the VM's name"`
	Path     string `json:"path" jsonschema:"the file's path in the VM (relative: from root's home)"`
	Offset   int64  `json:"offset,omitempty" jsonschema:"start this many bytes in (default 0)"`
	MaxBytes int    `json:"max_bytes,omitempty" jsonschema:"return at most this many bytes: 1 to 2097152 (default 262144)"`
}

// ReadFileOutput is (part of) a file.
type ReadFileOutput struct {
	Content string `json:"content"`
	// Encoding is text (UTF-8, as it is) or base64.
	Encoding string `json:"encoding"`
	// Size is the whole file's; Truncated says bytes follow what was
	// read (read on from offset+len).
	Size      int64 `json:"size"`
	Offset    int64 `json:"offset"`
	Bytes     int   `json:"bytes"`
	Truncated bool  `json:"truncated,omitempty"`
}

// WriteFileInput writes a file in a VM.
type WriteFileInput struct {
	Name     string `json:"name" jsonschema:"the VM's name"`
	Path     string `json:"path" jsonschema:"the file's path in the VM (relative: from root's home); its directory must exist"`
	Content  string `json:"content" jsonschema:"what to write (at most 2 MiB once decoded)"`
	Encoding string `json:"encoding,omitempty" jsonschema:"text (default) or base64"`
	Mode     string `json:"mode,omitempty" jsonschema:"octal permission bits, e.g. 0755 (default: 0644 for a new file, an existing one keeps its own)"`
	Append   bool   `json:"append,omitempty" jsonschema:"append instead of replacing"`
}

// WriteFileOutput says what was written.
type WriteFileOutput struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
	// Size is the file's size afterwards.
	Size int64 `json:"size"`
}

// guest opens an agent connection to VM name through the daemon (which
// checks that the caller may use it, and wakes it).
func (t *tools) guest(ctx context.Context, name string) (*agent.Client, error) {
	sc, err := t.api.SSH(ctx, name)
	if err != nil {
		return nil, err
	}
	return agent.FromSSH(sc), nil
}

func (t *tools) exec(ctx context.Context, _ *mcp.CallToolRequest, in ExecInput) (*mcp.CallToolResult, ExecOutput, error) {
	if err := checkExec(in); err != nil {
		return nil, ExecOutput{}, err
	}
	timeout, _ := execTimeout(in.TimeoutSeconds)
	keep, _ := byteCap("max_output_bytes", in.MaxOutputBytes, DefaultOutputBytes, MaxOutputBytes)
	g, err := t.guest(ctx, in.Name)
	if err != nil {
		return nil, ExecOutput{}, err
	}
	defer g.Close()
	stdout, stderr := &capped{max: keep}, &capped{max: keep}
	req := agent.ExecRequest{CmdLine: in.Command, Env: in.Env, Dir: in.Workdir, Stdout: stdout, Stderr: stderr}
	if in.Stdin != "" {
		req.Stdin = strings.NewReader(in.Stdin)
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	status, err := g.Exec(cctx, req)
	out := ExecOutput{ExitStatus: status}
	var cutOut, cutErr bool
	out.Stdout, out.StdoutBytes, cutOut = stdout.result()
	out.Stderr, out.StderrBytes, cutErr = stderr.result()
	out.Truncated = cutOut || cutErr
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			out.TimedOut = true
			res := &mcp.CallToolResult{IsError: true}
			return res, out, nil
		}
		return nil, ExecOutput{}, fmt.Errorf("exec in %s: %w", in.Name, err)
	}
	return nil, out, nil
}

func (t *tools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in ReadFileInput) (*mcp.CallToolResult, ReadFileOutput, error) {
	if err := validate.VMName(in.Name); err != nil {
		return nil, ReadFileOutput{}, err
	}
	if err := validate.GuestPath(in.Path); err != nil {
		return nil, ReadFileOutput{}, err
	}
	if in.Offset < 0 {
		return nil, ReadFileOutput{}, fmt.Errorf("bad offset %d: give 0 or more", in.Offset)
	}
	max, err := byteCap("max_bytes", in.MaxBytes, DefaultReadBytes, MaxFileBytes)
	if err != nil {
		return nil, ReadFileOutput{}, err
	}
	g, err := t.guest(ctx, in.Name)
	if err != nil {
		return nil, ReadFileOutput{}, err
	}
	defer g.Close()
	fs, err := g.SFTP()
	if err != nil {
		return nil, ReadFileOutput{}, err
	}
	defer fs.Close()
	f, err := fs.Open(in.Path)
	if err != nil {
		return nil, ReadFileOutput{}, fmt.Errorf("read %s in %s: %w", in.Path, in.Name, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, ReadFileOutput{}, fmt.Errorf("read %s in %s: %w", in.Path, in.Name, err)
	}
	if st.IsDir() {
		return nil, ReadFileOutput{}, fmt.Errorf("read %s in %s: a directory (list it with exec: ls -la %s)", in.Path, in.Name, agent.QuoteCommand([]string{in.Path}))
	}
	if _, err := f.Seek(in.Offset, io.SeekStart); err != nil {
		return nil, ReadFileOutput{}, fmt.Errorf("read %s in %s: %w", in.Path, in.Name, err)
	}
	// One byte more than asked says whether more follows (sizes of
	// /proc files are 0).
	data, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, ReadFileOutput{}, fmt.Errorf("read %s in %s: %w", in.Path, in.Name, err)
	}
	more := len(data) > max
	if more {
		data = data[:max]
	}
	content, enc := encode(data)
	return nil, ReadFileOutput{Content: content, Encoding: enc, Size: st.Size(), Offset: in.Offset, Bytes: len(data), Truncated: more}, nil
}

func (t *tools) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in WriteFileInput) (*mcp.CallToolResult, WriteFileOutput, error) {
	if err := validate.VMName(in.Name); err != nil {
		return nil, WriteFileOutput{}, err
	}
	if err := validate.GuestPath(in.Path); err != nil {
		return nil, WriteFileOutput{}, err
	}
	mode, setMode, err := fileMode(in.Mode)
	if err != nil {
		return nil, WriteFileOutput{}, err
	}
	data, err := fileContent(in.Content, in.Encoding)
	if err != nil {
		return nil, WriteFileOutput{}, err
	}
	g, err := t.guest(ctx, in.Name)
	if err != nil {
		return nil, WriteFileOutput{}, err
	}
	defer g.Close()
	fs, err := g.SFTP()
	if err != nil {
		return nil, WriteFileOutput{}, err
	}
	defer fs.Close()
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if in.Append {
		// Not O_APPEND: SFTP writes at offsets, and the agent's server
		// writes at the one sent. The end is where the client starts.
		flags = os.O_WRONLY | os.O_CREATE
	}
	f, err := fs.OpenFile(in.Path, flags)
	if err != nil {
		return nil, WriteFileOutput{}, fmt.Errorf("write %s in %s: %w", in.Path, in.Name, err)
	}
	if in.Append {
		if _, err := f.Seek(0, io.SeekEnd); err != nil {
			f.Close()
			return nil, WriteFileOutput{}, fmt.Errorf("write %s in %s: %w", in.Path, in.Name, err)
		}
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		return nil, WriteFileOutput{}, fmt.Errorf("write %s in %s: %w", in.Path, in.Name, err)
	}
	if setMode {
		if err := fs.Chmod(in.Path, mode); err != nil {
			return nil, WriteFileOutput{}, fmt.Errorf("write %s in %s: mode: %w", in.Path, in.Name, err)
		}
	}
	st, err := fs.Stat(in.Path)
	if err != nil {
		return nil, WriteFileOutput{}, fmt.Errorf("write %s in %s: %w", in.Path, in.Name, err)
	}
	return nil, WriteFileOutput{Path: in.Path, Bytes: len(data), Size: st.Size()}, nil
}
