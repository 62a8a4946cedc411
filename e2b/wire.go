package e2b

import (
	"encoding/json"
	"fmt"
	"time"
)

// den's own definitions of envd's process and filesystem messages
// (packages process and filesystem of E2B's envd protocol), in the
// Connect protocol's JSON form: the E2B SDKs speak JSON to envd
// (useBinaryFormat: false), so den registers a JSON codec of its own
// under the name "json" and serves only that. Field names are the
// protobuf JSON names (lowerCamelCase), bytes base64, 64-bit integers
// strings, enums their names.

// jsonCodec is Connect's "json" codec over encoding/json.
type jsonCodec struct{}

func (jsonCodec) Name() string                  { return "json" }
func (jsonCodec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("e2b: bad message: %w", err)
	}
	return nil
}

// process.ProcessConfig
type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

// process.PTY
type ptyConfig struct {
	Size *ptySize `json:"size,omitempty"`
}

type ptySize struct {
	Cols uint32 `json:"cols"`
	Rows uint32 `json:"rows"`
}

// process.StartRequest
type startRequest struct {
	Process *processConfig `json:"process"`
	PTY     *ptyConfig     `json:"pty,omitempty"`
	Tag     *string        `json:"tag,omitempty"`
	Stdin   *bool          `json:"stdin,omitempty"`
}

// process.ProcessEvent (a oneof: one field set)
type processEvent struct {
	Start     *startEvent `json:"start,omitempty"`
	Data      *dataEvent  `json:"data,omitempty"`
	End       *endEvent   `json:"end,omitempty"`
	Keepalive *struct{}   `json:"keepalive,omitempty"`
}

type startEvent struct {
	PID uint32 `json:"pid"`
}

// dataEvent is a oneof of stdout, stderr and pty.
type dataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	PTY    []byte `json:"pty,omitempty"`
}

type endEvent struct {
	ExitCode int32   `json:"exitCode"`
	Exited   bool    `json:"exited"`
	Status   string  `json:"status"`
	Error    *string `json:"error,omitempty"`
}

// process.StartResponse and process.ConnectResponse
type eventResponse struct {
	Event *processEvent `json:"event"`
}

// process.ProcessSelector (a oneof)
type selector struct {
	PID *uint32 `json:"pid,omitempty"`
	Tag *string `json:"tag,omitempty"`
}

// process.ConnectRequest, process.CloseStdinRequest
type selectRequest struct {
	Process *selector `json:"process"`
}

type empty struct{}

// process.ProcessInfo
type processInfo struct {
	Config *processConfig `json:"config"`
	PID    uint32         `json:"pid"`
	Tag    *string        `json:"tag,omitempty"`
}

// process.ListResponse
type listResponse struct {
	Processes []processInfo `json:"processes"`
}

// process.ProcessInput (a oneof)
type processInput struct {
	Stdin []byte `json:"stdin,omitempty"`
	PTY   []byte `json:"pty,omitempty"`
}

// process.SendInputRequest
type sendInputRequest struct {
	Process *selector     `json:"process"`
	Input   *processInput `json:"input"`
}

// process.StreamInputRequest (a oneof)
type streamInputRequest struct {
	Start *struct {
		Process *selector `json:"process"`
	} `json:"start,omitempty"`
	Data *struct {
		Input *processInput `json:"input"`
	} `json:"data,omitempty"`
	Keepalive *struct{} `json:"keepalive,omitempty"`
}

// process.SendSignalRequest
type sendSignalRequest struct {
	Process *selector `json:"process"`
	Signal  enum      `json:"signal"`
}

// process.UpdateRequest
type updateRequest struct {
	Process *selector  `json:"process"`
	PTY     *ptyConfig `json:"pty,omitempty"`
}

// enum is a protobuf enum in JSON: its name, or its number.
type enum struct {
	Name   string
	Number int32
}

func (e *enum) UnmarshalJSON(data []byte) error {
	if err := json.Unmarshal(data, &e.Name); err == nil {
		return nil
	}
	return json.Unmarshal(data, &e.Number)
}

// signals are process.Signal's values.
var signals = map[string]int32{"SIGNAL_UNSPECIFIED": 0, "SIGNAL_SIGTERM": 15, "SIGNAL_SIGKILL": 9}

// filesystem.EntryInfo
type entryInfo struct {
	Name          string    `json:"name"`
	Type          string    `json:"type"`
	Path          string    `json:"path"`
	Size          int64     `json:"size,string"`
	Mode          uint32    `json:"mode"`
	Permissions   string    `json:"permissions"`
	Owner         string    `json:"owner"`
	Group         string    `json:"group"`
	ModifiedTime  time.Time `json:"modifiedTime"`
	SymlinkTarget *string   `json:"symlinkTarget,omitempty"`
}

// filesystem.FileType's names.
const (
	fileTypeFile    = "FILE_TYPE_FILE"
	fileTypeDir     = "FILE_TYPE_DIRECTORY"
	fileTypeSymlink = "FILE_TYPE_SYMLINK"
)

// filesystem.StatRequest, MakeDirRequest, RemoveRequest
type pathRequest struct {
	Path string `json:"path"`
}

// filesystem.StatResponse, MakeDirResponse, MoveResponse
type entryResponse struct {
	Entry *entryInfo `json:"entry"`
}

// filesystem.MoveRequest
type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

// filesystem.ListDirRequest
type listDirRequest struct {
	Path  string `json:"path"`
	Depth uint32 `json:"depth"`
}

// filesystem.ListDirResponse
type listDirResponse struct {
	Entries []entryInfo `json:"entries"`
}
