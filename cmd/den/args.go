package main

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// hoistFlags lets flags follow the VM name (`den exec box --tty -- top`):
// urfave/cli stops at the first argument, so the command's flags found
// between it and "--" are moved before it.
func hoistFlags(app *cli.App, args []string) []string {
	if len(args) < 3 {
		return args
	}
	var cmd *cli.Command
	for _, c := range app.Commands {
		if c.Name == args[1] {
			cmd = c
		}
	}
	if cmd == nil {
		return args
	}
	takesValue := map[string]bool{}
	for _, f := range cmd.Flags {
		_, isBool := f.(*cli.BoolFlag)
		for _, n := range f.Names() {
			takesValue[n] = !isBool
		}
	}
	var flags, rest []string
	for i := 2; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		name := strings.TrimLeft(a, "-")
		name, _, hasValue := strings.Cut(name, "=")
		needs, known := takesValue[name]
		if !strings.HasPrefix(a, "-") || !known {
			rest = append(rest, a)
			continue
		}
		flags = append(flags, a)
		if needs && !hasValue && i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	out := append([]string{args[0], args[1]}, flags...)
	return append(out, rest...)
}
