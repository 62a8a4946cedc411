package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/denhq/den/internal/atomicfile"
)

// Anchor is a published figure of a comparable system.
type Anchor struct {
	System, Figure, Value, Conditions string
}

// Anchors are the published figures den is measured against.
var Anchors = []Anchor{
	{"Fly.io Sprites", "checkpoint", "~300 ms", "disk only (no memory)"},
	{"Fly.io Sprites", "restore", "~1 s", "from a checkpoint"},
	{"Fly.io Sprites", "wake", "0.1-2 s", "idle sprite reached"},
	{"E2B", "pause (memory+disk)", "~4 s per GiB of RAM", "Firecracker snapshot"},
	{"E2B", "resume", "~1 s", "from a paused sandbox"},
	{"Cloud Hypervisor", "restore of 1 GiB", "~6 ms OnDemand vs ~730 ms Copy", "userfaultfd lazy memory vs copy"},
	{"Fly.io Sprites", "storage per checkpoint", "what the disk changed", "disk only: memory is not kept"},
	{"E2B", "storage per snapshot", "the dirty pages (memfile diff)", "a diff against its parent: a lost parent makes every descendant unrestorable (e2b-dev/infra #2993)"},
	{"CubeSandbox", "incremental snapshot", "46 ms at 7 MB dirty, +40 ms per 100 MB", "soft-dirty pages"},
}

// WriteTable prints the figures as an aligned table.
func WriteTable(w io.Writer, r Result) error {
	fmt.Fprintf(w, "den bench on %s (%s, %d cores, %s), image %s, %d runs, took %s\n",
		r.Host, r.Machine.CPU, r.Machine.Cores, r.Machine.Memory, r.Image, r.Runs, r.Took)
	for v, ver := range r.VMMs {
		fmt.Fprintf(w, "  %s: %s\n", v, ver)
	}
	fmt.Fprintf(w, "  kvm: %s\n\n", r.Machine.KVM)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	p99 := hasP99(r)
	fmt.Fprintln(tw, "figure\tvmm\taccel\tguest\tmedian\tmin\tmax\t"+p99Cell(p99, "p99\t"))
	for _, f := range r.Figures {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.Name, f.VMM, f.Accel, f.Memory,
			format(f.Median, f.Unit), format(f.Min, f.Unit), format(f.Max, f.Unit), p99Cell(p99, format(f.P99, f.Unit)+"\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, f := range r.Figures {
		if f.Note != "" {
			fmt.Fprintf(w, "  %s: %s\n", f.Name, f.Note)
		}
	}
	if len(r.Ratios) > 0 {
		fmt.Fprintln(w, "\nratios (hold on any machine):")
		keys := make([]string, 0, len(r.Ratios))
		for k := range r.Ratios {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "  %-55s %.2f\n", k, r.Ratios[k])
		}
	}
	return nil
}

// hasP99 is whether any figure has a p99 (the tables then have its
// column).
func hasP99(r Result) bool {
	for _, f := range r.Figures {
		if f.P99 != 0 {
			return true
		}
	}
	return false
}

// p99Cell is cell when the table has a p99 column, else "".
func p99Cell(on bool, cell string) string {
	if on {
		return cell
	}
	return ""
}

func format(v float64, unit string) string {
	switch unit {
	case "ms":
		if v >= 10000 {
			return fmt.Sprintf("%.1f s", v/1000)
		}
		return fmt.Sprintf("%.0f ms", v)
	case "bytes":
		return fmt.Sprintf("%.0f B", v)
	case "MB/s":
		return fmt.Sprintf("%.0f MB/s", v)
	}
	return fmt.Sprintf("%g %s", v, unit)
}

// Markdown is the result as a Markdown table, with the anchors.
func Markdown(r Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# den bench: %s, %s\n\n", r.Host, r.Date.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "%s, %d cores, %s; kernel %s; KVM: %s. Image `%s`, %d runs per figure after a warm-up.\n\n",
		r.Machine.CPU, r.Machine.Cores, r.Machine.Memory, r.Machine.Kernel, r.Machine.KVM, r.Image, r.Runs)
	for v, ver := range r.VMMs {
		fmt.Fprintf(&b, "- %s: %s\n", v, ver)
	}
	p99 := hasP99(r)
	b.WriteString("\n| figure | vmm | accel | guest | median | min | max |" + p99Cell(p99, " p99 |") +
		"\n|---|---|---|---|---:|---:|---:|" + p99Cell(p99, "---:|") + "\n")
	for _, f := range r.Figures {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |%s\n", f.Name, f.VMM, f.Accel, f.Memory,
			format(f.Median, f.Unit), format(f.Min, f.Unit), format(f.Max, f.Unit), p99Cell(p99, " "+format(f.P99, f.Unit)+" |"))
	}
	for _, f := range r.Figures {
		if f.Note != "" {
			fmt.Fprintf(&b, "\n%s: %s\n", f.Name, f.Note)
		}
	}
	if len(r.Ratios) > 0 {
		b.WriteString("\n| ratio | value |\n|---|---:|\n")
		keys := make([]string, 0, len(r.Ratios))
		for k := range r.Ratios {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "| %s | %.2f |\n", k, r.Ratios[k])
		}
	}
	if len(r.Breakdowns) > 0 {
		b.WriteString("\n## Where the time goes (den bench --breakdown)\n")
		b.WriteString("\nSteps as the daemon traced them (medians; steps nest and overlap, so shares need not add up to 100%).\n")
		b.WriteString(breakdownMarkdown(r.Breakdowns))
	}
	b.WriteString("\n| anchor | figure | published | conditions |\n|---|---|---|---|\n")
	for _, a := range Anchors {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", a.System, a.Figure, a.Value, a.Conditions)
	}
	return b.String()
}

// Save writes the result as JSON and Markdown under dir and returns the
// JSON file's path.
func Save(dir string, r Result) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	base := ResultsPath(dir, r)
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", err
	}
	if err := atomicfile.Write(base+".json", append(data, '\n'), 0o644); err != nil {
		return "", err
	}
	if err := atomicfile.Write(base+".md", []byte(Markdown(r)), 0o644); err != nil {
		return "", err
	}
	return filepath.Clean(base + ".json"), nil
}
