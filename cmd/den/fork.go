package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/validate"
)

func forkCommand() *cli.Command {
	return &cli.Command{
		Name:      "fork",
		Usage:     "make a new VM from a checkpoint of another (or from its current state)",
		ArgsUsage: "NAME[@CHECKPOINT] NEWNAME",
		UsageText: "den fork NAME[@CHECKPOINT] NEWNAME [--with-secrets] [--json]",
		Description: `The new VM resumes where the checkpoint was taken, with its own hostname,
machine-id and reseeded random number generator. Without @CHECKPOINT the
source is checkpointed first. The fork gets none of the source's grants of
den's secrets unless --with-secrets says so.

Examples:
   den fork box@cp-3 experiment
   den fork box box2 --with-secrets`,
		Flags: withDaemon(jsonFlag(), &cli.BoolFlag{Name: "with-secrets", Usage: "give the fork the source's grants of den's secrets"}),
		Action: func(c *cli.Context) error {
			if c.NArg() != 2 {
				return cli.Exit("den fork: give a source and a new name (den fork box@cp-3 box2)", 2)
			}
			src, id, _ := strings.Cut(c.Args().Get(0), "@")
			name := c.Args().Get(1)
			if err := checkArgs(c, validate.VMName, src, name); err != nil {
				return err
			}
			if strings.Contains(c.Args().Get(0), "@") {
				if err := checkArgs(c, validate.CheckpointID, id); err != nil {
					return err
				}
			}
			ctx, cancel := withSignals(c)
			defer cancel()
			start := time.Now()
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			vm, err := cl.Fork(ctx, src, api.ForkRequest{Checkpoint: id, Name: name, WithSecrets: c.Bool("with-secrets")}, progressPrinter(c))
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, vm)
			}
			fmt.Fprintf(c.App.Writer, "forked %s to %s in %s\n", c.Args().Get(0), vm.Name, time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
}
