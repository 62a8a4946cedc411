package machine

import (
	"slices"
	"testing"
	"time"
)

func TestRetain(t *testing.T) {
	day := func(d, h int) time.Time { return time.Date(2026, 11, d, h, 0, 0, 0, time.UTC) }
	taken := []Scheduled{
		{"cp-1", day(20, 1)}, {"cp-2", day(20, 9)}, // day 20: cp-2 newest
		{"cp-3", day(21, 1)}, {"cp-4", day(21, 5)}, // day 21: cp-4
		{"cp-5", day(23, 1)}, {"cp-6", day(23, 2)}, {"cp-7", day(23, 3)}, // day 23: cp-7
	}
	ids := func(s []Scheduled) []string {
		var out []string
		for _, c := range s {
			out = append(out, c.ID)
		}
		return out
	}
	for _, c := range []struct {
		keep, daily int
		kept        []string
	}{
		{2, 0, []string{"cp-6", "cp-7"}},
		{0, 2, []string{"cp-4", "cp-7"}},
		{2, 3, []string{"cp-2", "cp-4", "cp-6", "cp-7"}},
		{1, 10, []string{"cp-2", "cp-4", "cp-7"}},
		{10, 0, ids(taken)},
	} {
		kept, drop := retain(taken, c.keep, c.daily)
		if !slices.Equal(ids(kept), c.kept) || len(kept)+len(drop) != len(taken) {
			t.Errorf("keep %d, daily %d: kept %v, dropped %v; want kept %v", c.keep, c.daily, ids(kept), drop, c.kept)
		}
	}
}
