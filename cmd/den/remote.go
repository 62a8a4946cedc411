package main

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
)

// hostFlagNames are the flags that name a host path or a daemon. A flag
// that reads the environment or a file is one too (isHostFlag).
var hostFlagNames = []string{"socket", "url", "token", "ca", "state-dir", "images", "volume-config"}

// checkRemoteVerb refuses, through the gateway, a command line whose
// verb is not one of RemoteVerbs (help's topic included), with a line
// of usage.
func checkRemoteVerb(args []string) error {
	usage := "usage: ssh -p PORT den@HOST VERB [ARGS] (verbs: " + strings.Join(RemoteVerbs, ", ") + ")"
	if len(args) < 2 {
		return errors.New("den: " + usage)
	}
	switch args[1] {
	case "--help", "-h", "--version", "-v":
		if len(args) > 2 {
			return errors.New("den: " + usage)
		}
		return nil
	}
	verb := args[1]
	if verb == "help" && len(args) > 2 {
		verb = args[2]
	}
	if !slices.Contains(RemoteVerbs, verb) {
		return fmt.Errorf("den: %q cannot be run through the gateway; %s", verb, usage)
	}
	return nil
}

// restrictRemote makes app the gateway's: the verbs it does not run are
// hidden, and the flags that name a host path or a daemon, or that read
// the environment or a file, are taken out, so that urfave/cli never
// reads them; the flags left read no environment. The returned check
// refuses a flag taken out by its name, in one line.
func restrictRemote(app *cli.App) flagCheck {
	refused := map[*cli.Command]map[string]string{}
	var walk func(cmds []*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, cmd := range cmds {
			var kept []cli.Flag
			for _, f := range cmd.Flags {
				if !isHostFlag(f) {
					clearEnv(f)
					kept = append(kept, f)
					continue
				}
				if refused[cmd] == nil {
					refused[cmd] = map[string]string{}
				}
				for _, n := range f.Names() {
					refused[cmd][n] = f.Names()[0]
				}
			}
			cmd.Flags = kept
			walk(cmd.Subcommands)
		}
	}
	walk(app.Commands)
	app.Flags = nil
	for _, cmd := range app.Commands {
		cmd.Hidden = cmd.Hidden || !slices.Contains(RemoteVerbs, cmd.Name)
	}
	return func(cmd *cli.Command, name string) error {
		if primary, ok := refused[cmd][name]; ok {
			return fmt.Errorf("den: --%s cannot be given through the gateway", primary)
		}
		return nil
	}
}

// isHostFlag says whether f names a host path or a daemon, or reads the
// environment or a file.
func isHostFlag(f cli.Flag) bool {
	for _, n := range f.Names() {
		if slices.Contains(hostFlagNames, n) {
			return true
		}
	}
	if _, ok := f.(*cli.PathFlag); ok {
		return true
	}
	if ef, ok := f.(interface{ GetEnvVars() []string }); ok && len(ef.GetEnvVars()) > 0 {
		return true
	}
	if fp, ok := flagField(f, "FilePath"); ok && fp.String() != "" {
		return true
	}
	tf, ok := flagField(f, "TakesFile")
	return ok && tf.Bool()
}

// flagField is f's exported field name, if f is a pointer to a struct
// that has one.
func flagField(f cli.Flag, name string) (reflect.Value, bool) {
	v := reflect.ValueOf(f)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return reflect.Value{}, false
	}
	fv := v.Elem().FieldByName(name)
	return fv, fv.IsValid()
}

// clearEnv empties f's EnvVars and FilePath: urfave/cli then reads
// neither the environment nor a file for it.
func clearEnv(f cli.Flag) {
	if ev, ok := flagField(f, "EnvVars"); ok && ev.CanSet() {
		ev.Set(reflect.Zero(ev.Type()))
	}
	if fp, ok := flagField(f, "FilePath"); ok && fp.CanSet() {
		fp.SetString("")
	}
}
