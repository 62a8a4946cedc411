package machine

import (
	"errors"

	"github.com/denhq/den/internal/validate"
)

// Errors the API layer maps onto answers; every error the Manager returns
// for bad input or state wraps one of them.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
	ErrInvalid  = validate.ErrInvalid
	ErrConflict = errors.New("not possible in this state")
	ErrNoSpace  = errors.New("not enough space")
	// ErrBusy: another operation holds the VM for longer than the caller
	// would wait.
	ErrBusy = errors.New("busy")
)
