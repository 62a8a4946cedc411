package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/fsdiff"
	"github.com/denhq/den/internal/validate"
)

func diffCommand() *cli.Command {
	return &cli.Command{
		Name:      "diff",
		Usage:     "show the files added, changed and removed between two checkpoints",
		ArgsUsage: "VM@CHECKPOINT [VM[@CHECKPOINT]]",
		UsageText: "den diff VM@CHECKPOINT [VM[@CHECKPOINT]] [--path PREFIX] [--stat | -p] [--json]",
		Description: `Compares the disks of two checkpoints: of one VM, or of a fork and its
origin. Without a second checkpoint it compares with the VM's current state:
den takes a disk-only checkpoint of it first (the VM keeps running; a
sleeping VM is not woken) and says which. The disk images are read on the
host, read-only.

Each line is a path: A added, D removed, M changed (what changed in
brackets: content, mode, owner, type, target), with its type, mode,
owner (uid:gid) and size. Symlinks show their targets; a new hard link
names the path it shares an inode with; a rename shows as the old path
removed and the new one added "from" it. Time stamps alone are no change.

Examples:
   den diff box@cp-1 box@cp-3
   den diff box@cp-2                       # against box as it is now
   den diff box@cp-2 experiment@cp-1       # a fork against its origin
   den diff box@cp-1 box@cp-3 --path /root/project -p
   den diff box@cp-1 box@cp-3 --stat
   den diff box@cp-1 box@cp-3 --json`,
		Flags: withDaemon(jsonFlag(),
			&cli.StringFlag{Name: "path", Usage: "only `PREFIX` and what is under it"},
			&cli.BoolFlag{Name: "stat", Usage: "one line per path and the summary"},
			&cli.BoolFlag{Name: "patch", Aliases: []string{"p"}, Usage: "unified diffs of text files"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() < 1 || c.NArg() > 2 {
				return usageExit(c, "give one or two checkpoints (den diff box@cp-1 box@cp-3)")
			}
			fromVM, from, err := parseSpec(c, c.Args().Get(0), true)
			if err != nil {
				return err
			}
			if _, err := fsdiff.CleanPrefix(c.String("path")); err != nil {
				return usageExit(c, "--path: %w", err)
			}
			req := api.DiffRequest{From: from, Path: c.String("path"), Patch: c.Bool("patch")}
			if c.NArg() == 2 {
				if req.ToVM, req.To, err = parseSpec(c, c.Args().Get(1), false); err != nil {
					return err
				}
			}
			ctx, cancel := withSignals(c)
			defer cancel()
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			d, err := cl.Diff(ctx, fromVM, req, progressPrinter(c))
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, d)
			}
			printDiff(c.App.Writer, d, c.Bool("stat"), c.Bool("patch"))
			return nil
		},
	}
}

// parseSpec reads VM@CHECKPOINT (or a bare VM where the checkpoint is
// optional: its current state), refusing a malformed one as a usage
// error.
func parseSpec(c *cli.Context, s string, needCheckpoint bool) (vm, id string, err error) {
	vm, id, at := strings.Cut(s, "@")
	if needCheckpoint && !at || at && id == "" {
		return "", "", usageExit(c, "%q is not VM@CHECKPOINT (den diff box@cp-1 box@cp-3)", s)
	}
	if err := checkArgs(c, validate.VMName, vm); err != nil {
		return "", "", err
	}
	if at {
		if err := checkArgs(c, validate.CheckpointID, id); err != nil {
			return "", "", err
		}
	}
	return vm, id, nil
}

var diffOps = map[string]string{"added": "A", "removed": "D", "changed": "M"}

// printDiff writes a diff for people: a line per path, the summary, and
// with patch the unified diffs.
func printDiff(w io.Writer, d *api.Diff, stat, patch bool) {
	if d.Taken {
		fmt.Fprintf(w, "comparing %s@%s with %s@%s, a disk-only checkpoint of %s's current state taken now\n", d.FromVM, d.From, d.ToVM, d.To, d.ToVM)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, ch := range d.Changes {
		f := ch.New
		if f == nil {
			f = ch.Old
		}
		if stat {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", diffOps[ch.Op], ch.Path, statBytes(ch))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d:%d\t%d\t%s%s\n", diffOps[ch.Op], f.Type, f.Mode, f.UID, f.GID, f.Size, ch.Path, diffNote(ch))
		if patch {
			tw.Flush()
			printPatch(w, ch)
		}
	}
	tw.Flush()
	s := d.Summary
	fmt.Fprintf(w, "%d added (%d bytes), %d changed (%+d bytes), %d removed (%d bytes)\n",
		s.Added, s.AddedBytes, s.Changed, s.ChangedBytes, s.Removed, s.RemovedBytes)
}

// statBytes is what a path added to or took from the regular files.
func statBytes(ch api.DiffChange) string {
	var n int64
	if ch.New != nil && ch.New.Type == "file" {
		n += ch.New.Size
	}
	if ch.Old != nil && ch.Old.Type == "file" {
		n -= ch.Old.Size
	}
	return fmt.Sprintf("%+d", n)
}

// diffNote says what changed of a path, and where it came from.
func diffNote(ch api.DiffChange) string {
	var notes []string
	if ch.New != nil && ch.New.Type == "symlink" {
		notes = append(notes, "-> "+ch.New.Target)
	} else if ch.Op == "removed" && ch.Old.Type == "symlink" {
		notes = append(notes, "-> "+ch.Old.Target)
	}
	var what []string
	for _, w := range ch.What {
		switch w {
		case "mode":
			what = append(what, "mode "+ch.Old.Mode+" -> "+ch.New.Mode)
		case "owner":
			what = append(what, fmt.Sprintf("owner %d:%d -> %d:%d", ch.Old.UID, ch.Old.GID, ch.New.UID, ch.New.GID))
		case "type":
			what = append(what, "type "+ch.Old.Type+" -> "+ch.New.Type)
		case "target":
			what = append(what, "target was "+ch.Old.Target)
		default:
			what = append(what, w)
		}
	}
	if len(what) > 0 {
		notes = append(notes, "("+strings.Join(what, ", ")+")")
	}
	if ch.LinkOf != "" {
		notes = append(notes, "(hard link of "+ch.LinkOf+")")
	}
	if ch.MovedFrom != "" {
		notes = append(notes, "(from "+ch.MovedFrom+")")
	}
	if len(notes) == 0 {
		return ""
	}
	return " " + strings.Join(notes, " ")
}

// printPatch writes a path's content change: a unified diff, or why
// there is none.
func printPatch(w io.Writer, ch api.DiffChange) {
	a, b := "a"+ch.Path, "b"+ch.Path
	if ch.Op == "added" {
		a = "/dev/null"
	}
	if ch.Op == "removed" {
		b = "/dev/null"
	}
	switch {
	case ch.Patch != "":
		io.WriteString(w, ch.Patch)
		if !strings.HasSuffix(ch.Patch, "\n") {
			io.WriteString(w, "\n")
		}
	case ch.Binary:
		fmt.Fprintf(w, "Binary files %s and %s differ\n", a, b)
	case ch.NoPatch != "":
		fmt.Fprintf(w, "(no patch of %s: %s)\n", ch.Path, ch.NoPatch)
	}
}
