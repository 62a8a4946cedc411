//go:build linux

package main

import gossh "golang.org/x/crypto/ssh"

func fingerprint(s gossh.Signer) string { return gossh.FingerprintSHA256(s.PublicKey()) }
