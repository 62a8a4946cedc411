package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/validate"
)

// The checkpoint tree of VM NAME is the resource den://vms/NAME/checkpoints:
// JSON, {"vm": NAME, "checkpoints": [...]} in lineage order, each with its
// parent, depth and the box-drawing prefix (tree) that draws it.
const (
	treeTemplate = "den://vms/{name}/checkpoints"
	treePrefix   = "den://vms/"
	treeSuffix   = "/checkpoints"
)

// Tree is the content of a checkpoint tree resource.
type Tree struct {
	VM          string           `json:"vm"`
	Checkpoints []api.Checkpoint `json:"checkpoints"`
	// Text draws the tree as den checkpoints does.
	Text string `json:"text"`
}

// addResources registers the checkpoint tree template on s, and lists
// one tree per VM of the caller in resources/list.
func addResources(s *mcp.Server, cl *api.Client) {
	s.AddResourceTemplate(&mcp.ResourceTemplate{
		Name: "checkpoints", Title: "A VM's checkpoint tree", URITemplate: treeTemplate, MIMEType: "application/json",
		Description: "The checkpoints of a VM in lineage order: id, parent, comment, kind, sizes, age; head marks the one its current state descends from.",
	}, func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return readTree(ctx, cl, req.Params.URI)
	})
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			if err != nil || method != "resources/list" {
				return res, err
			}
			lr, ok := res.(*mcp.ListResourcesResult)
			if !ok {
				return res, nil
			}
			vms, err := cl.ListVMs(ctx)
			if err != nil {
				return nil, fmt.Errorf("list vms: %w", err)
			}
			for _, vm := range vms {
				lr.Resources = append(lr.Resources, &mcp.Resource{
					URI: treePrefix + vm.Name + treeSuffix, Name: vm.Name + " checkpoints", MIMEType: "application/json",
					Description: "The checkpoint tree of VM " + vm.Name,
				})
			}
			return lr, nil
		}
	})
}

// treeName is the VM a checkpoint tree's URI names.
func treeName(uri string) (string, error) {
	name, ok := strings.CutPrefix(uri, treePrefix)
	if ok {
		name, ok = strings.CutSuffix(name, treeSuffix)
	}
	if !ok {
		return "", fmt.Errorf("bad resource %s: want %s", validate.Quote(uri), treeTemplate)
	}
	return name, validate.VMName(name)
}

// readTree reads the checkpoint tree resource uri.
func readTree(ctx context.Context, cl *api.Client, uri string) (*mcp.ReadResourceResult, error) {
	name, err := treeName(uri)
	if err != nil {
		return nil, err
	}
	cps, err := cl.Checkpoints(ctx, name)
	if errors.Is(err, api.ErrNotFound) {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if err != nil {
		return nil, err
	}
	if cps == nil {
		cps = []api.Checkpoint{}
	}
	data, err := json.MarshalIndent(Tree{VM: name, Checkpoints: cps, Text: drawTree(cps, time.Now())}, "", "  ")
	if err != nil {
		return nil, err
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(data)}}}, nil
}

// drawTree is the lineage as lines: tree prefix, id, age, comment, and
// marks for the head and damaged checkpoints.
func drawTree(cps []api.Checkpoint, now time.Time) string {
	var b strings.Builder
	for _, c := range cps {
		fmt.Fprintf(&b, "%s%s  %s ago  %s", c.Tree, c.ID, now.Sub(c.CreatedAt).Round(time.Second), c.Kind)
		if c.Comment != "" {
			fmt.Fprintf(&b, "  %q", c.Comment)
		}
		if c.Head {
			b.WriteString("  (head)")
		}
		if c.Damaged != "" {
			b.WriteString("  DAMAGED: " + c.Damaged)
		}
		b.WriteByte('\n')
	}
	return b.String()
}
