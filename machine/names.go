package machine

import (
	"github.com/denhq/den/internal/size"
	"github.com/denhq/den/internal/validate"
)

// ValidateName checks that a VM name is a DNS label: 1 to 63 lower-case
// letters, digits and hyphens, not starting or ending with a hyphen. VM
// names become hostnames and SSH user names; "den" and "help" are reserved.
// The rules are validate.VMName's.
func ValidateName(name string) error { return validate.VMName(name) }

// ValidateImage checks the form of an image name (validate.Image);
// whether the image exists is checkImage's to say.
func ValidateImage(name string) error { return validate.Image(name) }

// FormatSize prints bytes with a binary unit: 512M, 4G, 1.5G. See
// size.Format.
func FormatSize(b int64) string { return size.Format(b) }
