//go:build linux

package kubeapi

import (
	"os/exec"
	"syscall"
)

// endWithTest has the kernel end cmd's process should the test binary die without cleaning up.
func endWithTest(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
