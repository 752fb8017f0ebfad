//go:build linux

package nodelocal

import "github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"

// Backend names a rules backend, as Config.Backend and GuardConfig.Backend take it.
type Backend = rules.Mode

// The rules backends.
const (
	// BackendLegacy and BackendNFT are iptables' two flavours; BackendNFTables is tables of our own over
	// netlink, for kube-proxy's nftables mode.
	BackendLegacy   = rules.Legacy
	BackendNFT      = rules.NFT
	BackendNFTables = rules.NFTables
)

// The iptables chains of the cache's rules (in the raw and the filter table) and of its guard's divert,
// for checks of what a node holds.
const (
	RulesChain = rules.DefaultChain
	GuardChain = rules.GuardChain
)
