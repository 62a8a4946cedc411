package api

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"go.yaml.in/yaml/v3"
)

// TestOpenAPIDocument: openapi.yaml is a valid OpenAPI 3.1 document (by
// the specification's own schema).
func TestOpenAPIDocument(t *testing.T) {
	doc, err := libopenapi.NewDocument([]byte(OpenAPI))
	if err != nil {
		t.Fatalf("parse openapi.yaml: %v", err)
	}
	if v := doc.GetVersion(); !strings.HasPrefix(v, "3.1.") {
		t.Fatalf("openapi.yaml is OpenAPI %s, want 3.1", v)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatalf("openapi.yaml: %v", errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		for _, e := range verrs {
			t.Errorf("openapi.yaml: %v", e)
		}
	}
}

// wireTypes are the Go types of the API's bodies, by the name of their
// schema in openapi.yaml; requests are the ones the daemon decodes
// (strictly: no other fields).
var wireTypes = map[string]struct {
	v       any
	request bool
}{
	"ErrorBody": {v: ErrorBody{}}, "VM": {v: VM{}}, "ActivityEntry": {v: ActivityEntry{}}, "ActivityRecordRequest": {v: ActivityRecordRequest{}, request: true}, "Cgroup": {v: Cgroup{}}, "Event": {v: Event{}},
	"DaemonInfo": {v: DaemonInfo{}}, "Confinement": {v: Confinement{}}, "MemoryInfo": {v: MemoryInfo{}},
	"Checkpoint": {v: Checkpoint{}}, "Verification": {v: Verification{}}, "VerifiedFile": {v: VerifiedFile{}},
	"DiffRequest": {v: DiffRequest{}, request: true}, "Diff": {v: Diff{}}, "DiffChange": {v: DiffChange{}},
	"DiffFile": {v: DiffFile{}}, "DiffSummary": {v: DiffSummary{}},
	"RestorePathsRequest": {v: RestorePathsRequest{}, request: true}, "PathsRestored": {v: PathsRestored{}}, "PathAction": {v: PathAction{}},
	"Trace": {v: Trace{}}, "TraceStep": {v: TraceStep{}}, "NetInfo": {v: NetInfo{}}, "Denied": {v: Denied{}},
	"URLInfo": {v: URLInfo{}}, "HostVM": {v: HostVM{}}, "HostSummary": {v: HostSummary{}}, "HostEvent": {v: HostEvent{}},
	"Key": {v: Key{}}, "Token": {v: Token{}}, "AuditRecord": {v: AuditRecord{}},

	"CreateRequest": {CreateRequest{}, true}, "CheckpointRequest": {CheckpointRequest{}, true},
	"RestoreRequest": {RestoreRequest{}, true}, "ForkRequest": {ForkRequest{}, true},
	"SleepRequest": {SleepRequest{}, true}, "ResizeRequest": {ResizeRequest{}, true},
	"VerifyRequest": {VerifyRequest{}, true}, "EgressRequest": {EgressRequest{}, true},
	"URLRequest": {URLRequest{}, true}, "HostSleepRequest": {HostSleepRequest{}, true},
	"HostWakeRequest": {HostWakeRequest{}, true}, "AddKeyRequest": {AddKeyRequest{}, true},
	"AddTokenRequest": {AddTokenRequest{}, true}, "Secret": {v: Secret{}},
	"AddSecretRequest": {AddSecretRequest{}, true}, "SetSecretRequest": {SetSecretRequest{}, true}, "GrantRequest": {GrantRequest{}, true},

	"HostList": {v: HostList{}}, "Host": {v: Host{}}, "MoveRequest": {v: MoveRequest{}}, "DrainRequest": {v: DrainRequest{}}, "DrainResult": {v: DrainResult{}}, "DrainFailure": {v: DrainFailure{}}, "MoveResult": {v: MoveResult{}},
	"Storage": {v: Storage{}}, "Usage": {v: Usage{}}, "VMStorage": {v: VMStorage{}}, "CheckpointStorage": {v: CheckpointStorage{}},
	"GCResult": {v: GCResult{}}, "Schedule": {v: Schedule{}}, "ScheduleInfo": {v: ScheduleInfo{}},
	"GCRequest": {GCRequest{}, true}, "ScheduleRequest": {ScheduleRequest{}, true},
}

// schema is the part of a JSON Schema that TestOpenAPIWireTypes reads.
type schema struct {
	Ref                  string             `yaml:"$ref"`
	Type                 any                `yaml:"type"` // a name, or a list of names
	Format               string             `yaml:"format"`
	Properties           map[string]*schema `yaml:"properties"`
	Required             []string           `yaml:"required"`
	AdditionalProperties any                `yaml:"additionalProperties"`
	Items                *schema            `yaml:"items"`
}

// types is the schema's type names.
func (s *schema) types() []string {
	switch t := s.Type.(type) {
	case string:
		return []string{t}
	case []any:
		var out []string
		for _, n := range t {
			out = append(out, fmt.Sprint(n))
		}
		return out
	}
	return nil
}

// TestOpenAPIWireTypes: every object schema of openapi.yaml is a Go wire
// type field for field: the same JSON names, each of the JSON type its Go
// field encodes to; an answer's required fields are exactly those the
// daemon always sends (no omitempty), and a request refuses other fields,
// as the daemon does.
func TestOpenAPIWireTypes(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas map[string]*schema `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal([]byte(OpenAPI), &doc); err != nil {
		t.Fatalf("parse openapi.yaml: %v", err)
	}
	schemas := doc.Components.Schemas
	for name, s := range schemas {
		if _, ok := wireTypes[name]; !ok && slices.Contains(s.types(), "object") {
			t.Errorf("schema %s: no Go type in wireTypes", name)
		}
	}
	for name, w := range wireTypes {
		s, ok := schemas[name]
		if !ok {
			t.Errorf("%T: no schema %s in openapi.yaml", w.v, name)
			continue
		}
		checkStruct(t, schemas, name, s, reflect.TypeOf(w.v), w.request)
	}
}

// checkStruct compares schema name (s) with struct type st.
func checkStruct(t *testing.T, schemas map[string]*schema, name string, s *schema, st reflect.Type, request bool) {
	t.Helper()
	var fields, always []string
	for f := range st.Fields() {
		tag := f.Tag.Get("json")
		if !f.IsExported() || tag == "-" {
			continue
		}
		jname, opts, _ := strings.Cut(tag, ",")
		if jname == "" {
			jname = f.Name
		}
		fields = append(fields, jname)
		if !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") {
			always = append(always, jname)
		}
		p, ok := s.Properties[jname]
		if !ok {
			t.Errorf("schema %s: no property %q (%s.%s)", name, jname, st.Name(), f.Name)
			continue
		}
		if err := checkType(schemas, p, f.Type); err != nil {
			t.Errorf("schema %s, property %s (%s.%s, %s): %v", name, jname, st.Name(), f.Name, f.Type, err)
		}
	}
	var props []string
	for p := range s.Properties {
		props = append(props, p)
		if !slices.Contains(fields, p) {
			t.Errorf("schema %s: property %q is no field of %s", name, p, st.Name())
		}
	}
	if request {
		if s.AdditionalProperties != false {
			t.Errorf("schema %s: a request must have additionalProperties: false (the daemon refuses unknown fields)", name)
		}
		for _, r := range s.Required {
			if !slices.Contains(props, r) {
				t.Errorf("schema %s: required %q is no property", name, r)
			}
		}
		return
	}
	sort.Strings(always)
	req := slices.Sorted(slices.Values(s.Required))
	if !slices.Equal(req, always) {
		t.Errorf("schema %s: required %v, want the fields %s always has: %v", name, req, st.Name(), always)
	}
}

var timeType = reflect.TypeFor[time.Time]()

// checkType says whether the property schema p describes what Go type
// gt encodes to.
func checkType(schemas map[string]*schema, p *schema, gt reflect.Type) error {
	nullable := false
	if gt.Kind() == reflect.Pointer {
		gt, nullable = gt.Elem(), true
	}
	if gt.Kind() == reflect.Struct && gt != timeType {
		if want := "#/components/schemas/" + gt.Name(); p.Ref != want {
			return fmt.Errorf("$ref %q, want %q", p.Ref, want)
		}
		return nil
	}
	if ref, ok := strings.CutPrefix(p.Ref, "#/components/schemas/"); ok {
		// A named scalar (ErrorCode, Duration...).
		if p = schemas[ref]; p == nil {
			return fmt.Errorf("no schema %s", ref)
		}
	}
	var want string
	switch gt.Kind() {
	case reflect.String:
		want = "string"
	case reflect.Bool:
		want = "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want = "integer"
	case reflect.Float32, reflect.Float64:
		want = "number"
	case reflect.Slice:
		want, nullable = "array", true // a nil slice is null
	case reflect.Struct: // time.Time
		if p.Format != "date-time" {
			return fmt.Errorf("a time is a string of format date-time, not %q", p.Format)
		}
		want = "string"
	default:
		return fmt.Errorf("no JSON type for Go kind %s", gt.Kind())
	}
	types := p.types()
	if !slices.Contains(types, want) {
		return fmt.Errorf("type %v, want %s", types, want)
	}
	for _, ty := range types {
		if ty != want && !(ty == "null" && nullable) {
			return fmt.Errorf("type %v: %s cannot be %s", types, gt, ty)
		}
	}
	if gt.Kind() == reflect.Slice {
		if p.Items == nil {
			return fmt.Errorf("an array without items")
		}
		return checkType(schemas, p.Items, gt.Elem())
	}
	return nil
}
