//go:build linux

package nodelocal

import (
	"errors"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/link"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

func configError(op string, err error) error {
	return &Error{Kind: KindConfig, Op: op, Err: err}
}

// linkError classifies a link failure as node-cache does: looking is interface_check, changing is
// interface_add.
func linkError(op string, err error) error {
	kind := KindInterfaceCheck
	var le *link.Error
	if errors.As(err, &le) && le.Phase == link.Change {
		kind = KindInterfaceAdd
	}
	return &Error{Kind: kind, Op: op, Err: err}
}

func rulesError(op string, err error) error {
	kind := KindIPTables
	if rules.IsLockContention(err) {
		kind = KindIPTablesLock
	}
	return &Error{Kind: kind, Op: op, Err: err}
}
