package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/denhq/den/api"
	"github.com/denhq/den/machine"
)

// Request bodies and queries: how every handler reads what it was sent.

// ownedRequest reads the JSON body into req and checks that the request's
// owner may use the VM of the path, answering the error itself; it
// returns the VM's name.
func (s *Server) ownedRequest(w http.ResponseWriter, r *http.Request, req any) (string, bool) {
	name := r.PathValue("name")
	return name, decode(w, r, req) && s.owned(w, r, name)
}

// MaxBodyBytes bounds a request body: every request of the API is a
// small JSON object.
const MaxBodyBytes = 1 << 20

// decode reads a request's JSON body into v, answering the error itself
// (400, or 413 for a body over MaxBodyBytes): a field v does not have,
// a value of the wrong type, or anything after the object is refused,
// never ignored. An empty body is {}: every field takes its default.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	err := decodeBody(http.MaxBytesReader(w, r.Body, MaxBodyBytes), v)
	if err == nil {
		if err := checkBody(v); err != nil {
			writeError(w, err)
			return false
		}
		return true
	}
	status := http.StatusBadRequest
	if _, ok := errors.AsType[bodyTooLarge](err); ok {
		status = http.StatusRequestEntityTooLarge
	}
	writeJSON(w, status, api.ErrorBody{Error: err.Error(), Code: "invalid"})
	return false
}

// decodeBody reads one JSON object from body into v, strictly (see
// decode), and words its errors for the API's user.
func decodeBody(body io.Reader, v any) error {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty body
		}
		return bodyError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return bodyError(err)
		}
		return errors.New("bad request body: more after the JSON object: send one object")
	}
	return nil
}

// bodyError words an error of the JSON decoder plainly.
func bodyError(err error) error {
	if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return bodyTooLarge{limit: mbe.Limit}
	}
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		if te.Field == "" {
			return fmt.Errorf("bad request body: want a JSON object, got %s", te.Value)
		}
		return fmt.Errorf("bad request body: field %q must be %s, not %s", te.Field, jsonKind(te.Type), te.Value)
	}
	if se, ok := errors.AsType[*json.SyntaxError](err); ok {
		return fmt.Errorf("bad request body: %s (at byte %d)", strings.TrimPrefix(se.Error(), "json: "), se.Offset)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("bad request body: the JSON object ends early")
	}
	// Unknown fields: `json: unknown field "memory_mib"`.
	return fmt.Errorf("bad request body: %s", strings.TrimPrefix(err.Error(), "json: "))
}

// bodyTooLarge refuses a body over the limit.
type bodyTooLarge struct{ limit int64 }

func (e bodyTooLarge) Error() string {
	return fmt.Sprintf("request body too large: the API takes JSON objects of at most %d KiB", e.limit>>10)
}

// jsonKind names the JSON a Go type takes.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number, not negative"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}

// boolQuery reads a query parameter that is a flag: absent is false;
// "1", "true", "0", "false" and their like say what they mean; anything
// else is refused.
func boolQuery(r *http.Request, key string) (bool, error) {
	v := r.URL.Query().Get(key)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("bad query ?%s=%s: use 1 or 0: %w", key, v, machine.ErrInvalid)
	}
	return b, nil
}
