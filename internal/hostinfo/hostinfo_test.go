package hostinfo

import (
	"reflect"
	"testing"
)

func TestParseCPU(t *testing.T) {
	text := `processor	: 0
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum
flags		: sse2 fpu avx2

processor	: 1
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum
flags		: sse2 fpu avx2
`
	got := ParseCPU(text)
	want := CPUInfo{Vendor: "GenuineIntel", Model: "Intel(R) Xeon(R) Platinum", Count: 2, Flags: []string{"avx2", "fpu", "sse2"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseCPU = %+v, want %+v", got, want)
	}
	if c := ReadCPU(); c.Count == 0 || c.Vendor == "" || len(c.Flags) == 0 {
		t.Fatalf("ReadCPU on this host = %+v: no processor, vendor or flags", c)
	}
}
