// Package privtest decides what a test does when it needs root or a system tool it cannot find.
//
// On a developer's machine such a test skips with the reason. Under `make test` and CI the environment
// variable NODELOCALDNS_REQUIRE_PRIVILEGED is set, and the same gap fails the test instead: a privileged
// test that silently skips in CI proves nothing.
package privtest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// RequireEnv names the environment variable that turns a missing privilege or tool into a failure.
const RequireEnv = "NODELOCALDNS_REQUIRE_PRIVILEGED"

// Required reports whether missing privileges must fail tests rather than skip them.
func Required() bool {
	v := os.Getenv(RequireEnv)
	return v != "" && v != "0" && !strings.EqualFold(v, "false")
}

// RequirePrivileged stops the test unless the process is root and every tool is on PATH.
// It fails the test when Required, and skips it otherwise.
func RequirePrivileged(t testing.TB, tools ...string) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (euid 0)")
	}
	require(t, append(missing, missingTools(tools)...))
}

// RequireTools stops the test unless every tool is on PATH, for a test that needs a tool but not root (a
// checker, say). It fails the test when Required, and skips it otherwise.
func RequireTools(t testing.TB, tools ...string) {
	t.Helper()
	require(t, missingTools(tools))
}

func missingTools(tools []string) []string {
	var missing []string
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	return missing
}

// require fails or skips the test when anything is missing.
func require(t testing.TB, missing []string) {
	t.Helper()
	if len(missing) == 0 {
		return
	}
	msg := "needs " + strings.Join(missing, ", ")
	if Required() {
		t.Fatalf("%s; %s is set, so this is a failure, not a skip", msg, RequireEnv)
	}
	t.Skipf("%s; set %s=1 to make this a failure", msg, RequireEnv)
}

// IptablesCommands returns the commands of iptables' flavour ("legacy" or "nft"), for both families, with
// their save and restore: what a test of that flavour requires.
func IptablesCommands(flavour string) []string {
	cmds := make([]string, 0, 6)
	for _, family := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			cmds = append(cmds, family+"-"+flavour+suffix)
		}
	}
	return cmds
}
