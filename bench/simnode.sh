# The simulated node the benchmarks in bench/ run on, sourced by them (bash); not a script of its own.
#
# Built from network namespaces as test/simnode lays it out: a Pod (10.244.0.2), the node with kube-proxy-style
# DNAT for the kube-dns ClusterIPs (10.96.0.10 and kube-dns-upstream's 10.96.0.11), a cluster-DNS Pod
# (10.244.1.2) and the node's resolver (192.0.2.53). Every address exists only in those namespaces. The
# caches run in the node namespace and answer on 169.254.20.10 (and 10.96.0.10), which the Pod asks.
#
# The sourcing script defines die MESSAGE, a work directory $work and an array pids of the processes it
# started, and sets simnode_cleanup as its EXIT trap.

# Addresses of the simulated node (test/simnode's).
POD_IP=10.244.0.2 NODE_POD_IP=10.244.0.1
DNS_POD_IP=10.244.1.2 NODE_DNS_IP=10.244.1.1
EXT_IP=192.0.2.53 NODE_EXT_IP=192.0.2.1
KUBE_DNS_IP=10.96.0.10 UPSTREAM_IP=10.96.0.11 LOCAL_IP=169.254.20.10

# simnode_require_tools TOOL...: installs the Debian package of each TOOL that has one (dnsperf, unbound, and
# gnuplot-nox for gnuplot) when missing, then requires every TOOL on PATH.
simnode_require_tools() {
    local missing=() tool
    for tool in "$@"; do
        case $tool in
        dnsperf | unbound) command -v "$tool" >/dev/null || missing+=("$tool") ;;
        gnuplot) command -v gnuplot >/dev/null || missing+=(gnuplot-nox) ;;
        esac
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing ${missing[*]} (Debian packages)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
            die "could not install ${missing[*]}"
    fi
    for tool in "$@"; do
        command -v "$tool" >/dev/null || die "$tool is not installed"
    done
}

in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

# simnode_positive VAR...: dies unless each variable named holds a positive integer.
simnode_positive() {
    local v
    for v in "$@"; do
        [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer"
    done
}

# simnode_rates VAR: dies unless the variable named holds positive integers (a list of query rates).
simnode_rates() {
    local rate
    for rate in ${!1}; do
        [[ $rate =~ ^[1-9][0-9]*$ ]] || die "$1 must be positive integers"
    done
}

# simnode_server_settings: dies unless NICE is an integer, HOT_PERCENT 0-100, and the machine has the 2 CPUs
# the CPU benchmarks put the server on one of, dnsperf and the cluster DNS on the other.
simnode_server_settings() {
    [[ $NICE =~ ^-?[0-9]+$ ]] || die "NICE must be an integer"
    [[ $HOT_PERCENT =~ ^[0-9]+$ && $HOT_PERCENT -le 100 ]] || die "HOT_PERCENT must be 0-100"
    [ "$(nproc)" -ge 2 ] || die "needs 2 CPUs: one for the server, one for dnsperf and the cluster DNS"
}

# simnode_cleanup: stops the processes in pids, takes the node down and, unless KEEP is set, removes $work.
simnode_cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    simnode_down
    [ -n "${KEEP:-}" ] || rm -rf "$work"
}

# simnode_node_cache: puts the node-cache image's two builds into $work: $NODE_CACHE (and $NODE_CACHE-full
# beside it, when there is one) if set, else both built as cmd/node-cache/Dockerfile builds them, the
# lean node-cache the manifests start and node-cache-full, which it execs for a Corefile using trace. With
# NODE_CACHE_ALT set, that build (and its -full beside it, when there is one) becomes node-cache-alt and
# VARIANTS gains the variant "alt".
simnode_node_cache() {
    if [ -n "${NODE_CACHE:-}" ]; then
        cp "$NODE_CACHE" "$work/node-cache"
        [ ! -e "$NODE_CACHE-full" ] || cp "$NODE_CACHE-full" "$work/node-cache-full"
    else
        echo "building cmd/node-cache as its Dockerfile does (node-cache and node-cache-full)"
        CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -tags nodecache_lean -o "$work/node-cache" ./cmd/node-cache
        CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$work/node-cache-full" ./cmd/node-cache
    fi
    if [ -n "${NODE_CACHE_ALT:-}" ]; then
        cp "$NODE_CACHE_ALT" "$work/node-cache-alt"
        [ ! -e "$NODE_CACHE_ALT-full" ] || cp "$NODE_CACHE_ALT-full" "$work/node-cache-alt-full"
        VARIANTS="$VARIANTS alt"
    fi
    # The cluster DNS and the node's resolver run a copy of their own, so that the cache's executable pages are
    # its own, and all are written back, as an image's binaries are on a node: node-cache drops its
    # executable's unmapped pages from the page cache after a start (cmd/node-cache/trim.go), which pages
    # another process maps, or a freshly written file's dirty pages, escape.
    cp "$work/node-cache" "$work/node-cache-upstreams"
    sync "$work"/node-cache*
}

# simnode_up PREFIX: builds the node in namespaces PREFIX-node, -pod, -dns and -ext (ns_node, ns_pod, ns_dns,
# ns_ext).
simnode_up() {
    ns_node=$1-node ns_pod=$1-pod ns_dns=$1-dns ns_ext=$1-ext
    local ns
    for ns in "$ns_node" "$ns_pod" "$ns_dns" "$ns_ext"; do
        ip netns add "$ns"
        in_ns "$ns" ip link set lo up
    done
    simnode_connect "$ns_pod" pod "$POD_IP" "$NODE_POD_IP"
    simnode_connect "$ns_dns" dns "$DNS_POD_IP" "$NODE_DNS_IP"
    simnode_connect "$ns_ext" ext "$EXT_IP" "$NODE_EXT_IP"
    in_ns "$ns_node" ip route add default via "$EXT_IP"
    in_ns "$ns_node" sysctl -qw net.ipv4.ip_forward=1
    {
        echo '*nat'
        echo ':KUBE-SERVICES - [0:0]'
        echo ':KUBE-SVC-KUBEDNS - [0:0]'
        echo '-A PREROUTING -j KUBE-SERVICES'
        echo '-A OUTPUT -j KUBE-SERVICES'
        local ip proto
        for ip in "$KUBE_DNS_IP" "$UPSTREAM_IP"; do
            for proto in udp tcp; do
                echo "-A KUBE-SERVICES -d $ip/32 -p $proto -m $proto --dport 53 -j KUBE-SVC-KUBEDNS"
            done
        done
        for proto in udp tcp; do
            echo "-A KUBE-SVC-KUBEDNS -p $proto -m $proto -j DNAT --to-destination $DNS_POD_IP:53"
        done
        echo 'COMMIT'
    } | in_ns "$ns_node" iptables-restore --noflush
    # The node's resolv.conf (the cache's dnsPolicy: Default) and the Pod's.
    mkdir -p "/etc/netns/$ns_node" "/etc/netns/$ns_pod"
    echo "nameserver $EXT_IP" >"/etc/netns/$ns_node/resolv.conf"
    echo "nameserver $LOCAL_IP" >"/etc/netns/$ns_pod/resolv.conf"
}

# simnode_connect NS NAME IP NODE_IP: a veth from the node to NS, IP on NS's side, NS's default route.
simnode_connect() {
    in_ns "$ns_node" ip link add "to-$2" type veth peer name "tmp-$2"
    in_ns "$ns_node" ip link set "tmp-$2" netns "$1"
    in_ns "$1" ip link set "tmp-$2" name eth0
    in_ns "$ns_node" ip addr add "$4/24" dev "to-$2"
    in_ns "$1" ip addr add "$3/24" dev eth0
    in_ns "$ns_node" ip link set "to-$2" up
    in_ns "$1" ip link set eth0 up
    in_ns "$1" ip route add default via "$4"
}

# simnode_down: removes what simnode_up made; safe to call when it did not finish.
simnode_down() {
    local ns
    for ns in "${ns_pod:-}" "${ns_dns:-}" "${ns_ext:-}" "${ns_node:-}"; do
        [ -z "$ns" ] || ip netns del "$ns" 2>/dev/null || true
    done
    [ -z "${ns_node:-}" ] || rm -rf "/etc/netns/$ns_node" "/etc/netns/$ns_pod"
}

# wait_dns NS SERVER NAME: waits up to 20 s for SERVER to answer NAME (A) with a record, from namespace NS.
wait_dns() {
    for _ in $(seq 1 200); do
        if in_ns "$1" dig +short +tries=1 +time=1 @"$2" "$3" A 2>/dev/null | grep -q .; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# simnode_corefiles: writes $work/Corefile.base.shipped, the ConfigMap of the iptables manifest, and
# $work/Corefile.base.upstream, upstream node-cache's with its install-time variables filled in as upstream's
# instructions do with sed.
simnode_corefiles() {
    local manifest=examples/kubernetes/nodelocaldns-iptables.yaml
    awk '/^  Corefile: \|$/ { on = 1; next } on && /^---$/ { exit } on { sub(/^        /, ""); print }' "$manifest" \
        >"$work/Corefile.base.shipped"
    grep -q '^cluster.local:53 {' "$work/Corefile.base.shipped" || die "no Corefile found in $manifest"
    sed -e 's/__PILLAR__DNS__DOMAIN__/cluster.local/g' -e "s/__PILLAR__LOCAL__DNS__/$LOCAL_IP/g" \
        -e "s/__PILLAR__DNS__SERVER__/$KUBE_DNS_IP/g" corefile/testdata/upstream-template.Corefile >"$work/Corefile.base.upstream"
}

# simnode_awk_median is an awk function, median(a, n), of the n values a[1..n] (it sorts them in place, by
# insertion: mawk has no asort), for the scripts' summaries: awk "$simnode_awk_median"' ...program...'.
# shellcheck disable=SC2034 # used by the scripts that source this file
simnode_awk_median='
function median(a, n,    i, j, x) {
    for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}'

# simnode_cluster_dns NICE [LAUNCHER...]: starts the cluster DNS (in ns_dns: svcN.* names have an A record,
# xN.* names and other types are NXDOMAIN with the SOA a negative answer needs to be cached) and the node's
# resolver (in ns_ext: every A query answered), both $work/node-cache-upstreams, the cluster DNS at nice NICE,
# through LAUNCHER (e.g. taskset -c 1), and waits until both answer.
simnode_cluster_dns() {
    local level=$1
    shift
    cat >"$work/Corefile.clusterdns" <<EOF
cluster.local:53 {
    bind $DNS_POD_IP
    template IN A cluster.local {
        match "^svc[0-9]+[.]"
        answer "{{ .Name }} 30 IN A 10.97.0.1"
        fallthrough
    }
    template ANY ANY cluster.local {
        rcode NXDOMAIN
        authority "cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 30"
    }
}
in-addr.arpa:53 ip6.arpa:53 {
    bind $DNS_POD_IP
    template ANY ANY {
        rcode NXDOMAIN
    }
}
EOF
    cat >"$work/Corefile.ext" <<EOF
.:53 {
    bind $EXT_IP
    template IN A {
        answer "{{ .Name }} 60 IN A 192.0.2.80"
    }
}
EOF
    simnode_start_upstreams "$level" svc1.probe.svc.cluster.local "$@"
}

# simnode_start_upstreams NICE NAME [LAUNCHER...]: starts $work/node-cache-upstreams (a copy of $work/node-cache)
# with $work/Corefile.clusterdns in ns_dns (at nice NICE) and with $work/Corefile.ext in ns_ext, both through
# LAUNCHER, and waits until the cluster DNS answers NAME and the node's resolver probe.example.org.
simnode_start_upstreams() {
    local level=$1 name=$2
    shift 2
    # ip netns exec, not in_ns: a function in the background would leave $! the PID of a subshell.
    nice -n "$level" ip netns exec "$ns_dns" "$@" "$work/node-cache-upstreams" -conf "$work/Corefile.clusterdns" >"$work/clusterdns.log" 2>&1 &
    pids+=($!)
    ip netns exec "$ns_ext" "$@" "$work/node-cache-upstreams" -conf "$work/Corefile.ext" >"$work/ext.log" 2>&1 &
    pids+=($!)
    wait_dns "$ns_dns" "$DNS_POD_IP" "$name" || die "the cluster DNS does not answer; see $work/clusterdns.log"
    wait_dns "$ns_ext" "$EXT_IP" probe.example.org || die "the node's resolver does not answer; see $work/ext.log"
}

# simnode_unbound_conf: writes $work/unbound.conf, unbound as a node cache: one thread, forwarding
# cluster.local and the reverse zones to kube-dns-upstream over TCP and everything else to the node's
# resolver, TTLs clamped to 5-30 s (5 s negative) as the Corefile does. UNBOUND_VERBOSITY sets its verbosity.
simnode_unbound_conf() {
    cat >"$work/unbound.conf" <<EOF
server:
    interface: $LOCAL_IP
    interface: $KUBE_DNS_IP
    port: 53
    num-threads: 1
    do-daemonize: no
    username: ""
    chroot: ""
    directory: "$work"
    pidfile: "$work/unbound.pid"
    use-syslog: no
    logfile: ""
    verbosity: ${UNBOUND_VERBOSITY:-0}
    access-control: 0.0.0.0/0 allow
    module-config: "iterator"
    domain-insecure: "cluster.local"
    unblock-lan-zones: yes
    insecure-lan-zones: yes
    cache-min-ttl: 5
    cache-max-ttl: 30
    cache-max-negative-ttl: 5
forward-zone:
    name: "cluster.local."
    forward-addr: $UPSTREAM_IP
    forward-tcp-upstream: yes
forward-zone:
    name: "in-addr.arpa."
    forward-addr: $UPSTREAM_IP
    forward-tcp-upstream: yes
forward-zone:
    name: "ip6.arpa."
    forward-addr: $UPSTREAM_IP
    forward-tcp-upstream: yes
forward-zone:
    name: "."
    forward-addr: $EXT_IP
EOF
    unbound-checkconf "$work/unbound.conf" >/dev/null || die "unbound-checkconf rejects $work/unbound.conf"
}

# simnode_start VARIANT [LAUNCHER...]: starts a cache in the node namespace, with its log in $work/VARIANT/log,
# through LAUNCHER (e.g. taskset -c 0), and sets cache_pid. Every launcher, `ip netns exec` and env exec in
# place, so cache_pid is the cache's own PID. VARIANT is one of:
#   shipped   $work/node-cache with the arguments of examples/kubernetes/nodelocaldns-iptables.yaml and
#             $work/Corefile.base.shipped
#   upstream  the same with $work/Corefile.base.upstream
#   alt       the shipped variant with another build, $work/node-cache-alt, to compare two builds
#   unbound   unbound with $work/unbound.conf, after `node-cache -cleanup` takes away the divert a node cache
#             that ran before left; its addresses go on a portless bridge, as notrack's do
#   floor     $work/floor-server (simnode_floor) on 169.254.20.10, set up as unbound is: every query answered by one
#             recvfrom and one sendto, no cache and no upstream
simnode_start() {
    local variant=$1 dir=$work/$1
    shift
    rm -rf "$dir"
    mkdir -p "$dir"
    case $variant in
    shipped | upstream | alt)
        local binary=$work/node-cache corefile=$work/Corefile.base.$variant
        if [ "$variant" = alt ]; then
            binary=$work/node-cache-alt corefile=$work/Corefile.base.shipped
        fi
        cp "$corefile" "$dir/Corefile.base"
        mkdir "$dir/kube-dns" # the manifest's optional kube-dns ConfigMap volume, with no ConfigMap
        # The manifest's arguments, with the paths of this run; KUBE_DNS_UPSTREAM_* as the kubelet sets them.
        "$@" ip netns exec "$ns_node" env KUBE_DNS_UPSTREAM_SERVICE_HOST=$UPSTREAM_IP KUBE_DNS_UPSTREAM_SERVICE_PORT=53 \
            XTABLES_LOCKFILE="$dir/xtables.lock" \
            "$binary" -localip "$LOCAL_IP,$KUBE_DNS_IP" -conf "$dir/Corefile" \
            -basecorefile "$dir/Corefile.base" -kubednscm "$dir/kube-dns" -upstreamsvc kube-dns-upstream \
            -pidfile "$dir/node-cache.pid" -health-port 8080 -prometheus-listen-address "$NODE_POD_IP:9253" \
            -lockfile "$dir/nodelocaldns.lock" >"$dir/log" 2>&1 &
        ;;
    unbound | floor)
        # A node cache that ran before handed the node to the cluster DNS at exit (a divert of the node-local
        # addresses to kube-dns): take that away, as an uninstall does, or the queries never reach unbound.
        ip netns exec "$ns_node" env XTABLES_LOCKFILE="$dir/xtables.lock" "$work/node-cache" -cleanup \
            -lockfile "$dir/nodelocaldns.lock" >"$dir/cleanup.log" 2>&1 ||
            die "node-cache -cleanup before $variant failed: $(tail -5 "$dir/cleanup.log")"
        in_ns "$ns_node" ip link add ubound type bridge
        in_ns "$ns_node" ip addr add "$LOCAL_IP/32" dev ubound
        in_ns "$ns_node" ip addr add "$KUBE_DNS_IP/32" dev ubound
        in_ns "$ns_node" ip link set ubound up
        if [ "$variant" = unbound ]; then
            "$@" ip netns exec "$ns_node" unbound -d -c "$work/unbound.conf" >"$dir/log" 2>&1 &
        else
            "$@" ip netns exec "$ns_node" "$work/floor-server" "$LOCAL_IP" >"$dir/log" 2>&1 &
        fi
        ;;
    *)
        die "unknown variant $variant"
        ;;
    esac
    cache_pid=$!
    pids+=("$cache_pid")
}

# simnode_floor: builds bench/floor.c, the floor variant, into $work/floor-server (cc, -O2).
simnode_floor() {
    cc -O2 -o "$work/floor-server" bench/floor.c || die "could not build bench/floor.c"
}

# simnode_foreign VARIANT: whether VARIANT is a server other than node-cache (unbound, floor), whose addresses
# simnode_start puts on a bridge of its own and which puts no rules in place.
simnode_foreign() { [ "$1" = unbound ] || [ "$1" = floor ]; }

# simnode_ready VARIANT NAME: waits until the cache answers NAME from the Pod and, for node-cache, notrack's
# rules are in place (node-cache answers before, and the rules are part of the state measured).
simnode_ready() {
    wait_dns "$ns_pod" "$LOCAL_IP" "$2" || die "$1 does not answer on $LOCAL_IP; see $work/$1/log"
    ! simnode_foreign "$1" || return 0
    for _ in $(seq 1 100); do
        grep -q 'rules in place' "$work/$1/log" && return 0
        sleep 0.1
    done
    die "$1: notrack never put its rules in place: $(tail -5 "$work/$1/log")"
}

# simnode_stop VARIANT: SIGTERM and wait, so the next variant finds the addresses free.
simnode_stop() {
    kill -TERM "$cache_pid" 2>/dev/null || true
    wait "$cache_pid" 2>/dev/null || true
    if simnode_foreign "$1"; then
        in_ns "$ns_node" ip link del ubound
    fi
}

# simnode_mix FILE COUNT FIRST_NEW PERCENT_HOT: writes COUNT queries of the mix to FILE: PERCENT_HOT % of them
# for the HOT names (svcK.nsM, K in 1..HOT, chosen at random), the rest for new names, the K-th of them
# svcK (NOERROR) or xK (NXDOMAIN) alternately from K = FIRST_NEW + 1 on. Callers give each phase its own range
# of K, so that a new name is new to the cache in every phase of a run. simnode_hot FILE writes the HOT names
# once each.
simnode_mix() {
    awk -v n="$2" -v fresh="$3" -v hot="$HOT" -v pct="$4" 'BEGIN {
        srand(1)
        for (i = 0; i < n; i++) {
            if (rand() * 100 < pct) { k = 1 + int(rand() * hot); p = "svc" } else { k = ++fresh; p = fresh % 2 ? "svc" : "x" }
            printf "%s%d.ns%d.svc.cluster.local A\n", p, k, k % 97
        }
    }' >"$1"
}
simnode_hot() { seq 1 "$HOT" | awk '{ printf "svc%d.ns%d.svc.cluster.local A\n", $1, $1 % 97 }' >"$1"; }

# simnode_cpu_ns PID: the CPU time of all the process's threads, in ns (the first field of
# /proc/PID/task/*/schedstat: time on a CPU, to the ns, where /proc/PID/stat counts clock ticks).
simnode_cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f\n", s }'; }

# simnode_switches PID: the context switches of all the process's threads so far, voluntary (it waited) and
# not (it was preempted), from /proc/PID/task/*/status.
simnode_switches() {
    cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^(non)?voluntary_ctxt_switches:/ { s += $2 } END { print s + 0 }'
}

# simnode_dnsperf FILE ARGS...: runs dnsperf from the Pod over FILE once (more with ARGS such as -l), at nice
# NICE on CPU CLIENT_CPU, and measures the CPU time of cache_pid over the run; sets qps, completed, lost,
# failed, us_per_query (CPU µs per completed query), switches_per_query (its threads' context switches per
# completed query: at a few thousand queries a second, one when each query wakes it and it sleeps again,
# more when the client it wakes preempts it) and dnsperf_out. It fails on lost queries (more than
# 0.1 %) or answers other than NOERROR and NXDOMAIN, unless tolerate_failures is set: then those are counted
# in failed (SERVFAIL when the upstream exchange failed).
simnode_dnsperf() {
    local file=$1 out t0 t1 s0 s1 rcodes
    shift
    t0=$(simnode_cpu_ns "$cache_pid") s0=$(simnode_switches "$cache_pid")
    out=$(nice -n "$NICE" ip netns exec "$ns_pod" taskset -c "$CLIENT_CPU" dnsperf -s "$LOCAL_IP" -d "$file" -c 4 -q 200 -t 5 -n 1 "$@" 2>&1) ||
        die "dnsperf failed: $out"
    t1=$(simnode_cpu_ns "$cache_pid") s1=$(simnode_switches "$cache_pid")
    completed=$(awk '/Queries completed:/ { print $3 }' <<<"$out" | head -1)
    lost=$(awk '/Queries lost:/ { print $3 }' <<<"$out" | head -1)
    qps=$(awk '/Queries per second:/ { printf "%.0f", $4 }' <<<"$out")
    [ -n "$lost" ] || die "$variant: no dnsperf statistics: $(tail -20 <<<"$out")"
    rcodes=$(sed -n 's/^ *Response codes: *//p' <<<"$out")
    failed=$((lost + $(sed -e 's/NOERROR [0-9]* ([0-9.]*%)//' -e 's/NXDOMAIN [0-9]* ([0-9.]*%)//' <<<"$rcodes" |
        { grep -o "[A-Z]* [0-9]*" || true; } | awk '{ s += $2 } END { print s + 0 }')))
    if [ -z "${tolerate_failures:-}" ]; then
        [ $((lost * 1000)) -le "$((completed + lost))" ] || die "$variant: dnsperf lost $lost queries: $(tail -20 <<<"$out")"
        [ "$failed" -eq "$lost" ] || die "$variant: answers other than NOERROR and NXDOMAIN: $rcodes"
    fi
    us_per_query=$(awk -v t=$((t1 - t0)) -v n="$completed" 'BEGIN { printf "%.1f", t / 1e3 / n }')
    switches_per_query=$(awk -v s=$((s1 - s0)) -v n="$completed" 'BEGIN { printf "%.2f", s / n }')
    dnsperf_out=$out
}
