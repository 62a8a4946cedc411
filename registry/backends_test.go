package registry

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/denhq/den/internal/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	os.Exit(code)
}

// eachBackend runs f on each backend, SQLite and PostgreSQL (a real
// server, a fresh database of the test's own). open opens that one
// store, again each time it is called: a reopen sees what was written.
func eachBackend(t *testing.T, f func(t *testing.T, open func() (*DB, error))) {
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "den.db")
		f(t, func() (*DB, error) { return Open(path) })
	})
	t.Run("postgres", func(t *testing.T) {
		url := pgtest.Shared(t).NewDatabase(t)
		f(t, func() (*DB, error) { return OpenPostgres(t.Context(), url) })
	})
}
