{{/*
Names and labels. The chart's objects carry the release's name; the Pods also keep upstream's
k8s-app label, which dashboards and kubectl recipes written for upstream's manifest select by.
*/}}
{{- define "node-local-dns.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "node-local-dns.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := .Values.nameOverride | default .Chart.Name -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount of the Pods: the chart's own, or one that exists (serviceAccount.create=false). */}}
{{- define "node-local-dns.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "node-local-dns.fullname" .) -}}
{{- else if .Values.serviceAccount.name -}}
{{- .Values.serviceAccount.name -}}
{{- else -}}
{{- fail "serviceAccount.name: name the ServiceAccount to reuse when serviceAccount.create is false" -}}
{{- end -}}
{{- end -}}

{{/* The uninstall hook's objects' name. */}}
{{- define "node-local-dns.uninstallHookName" -}}
{{- printf "%s-uninstall" (include "node-local-dns.fullname" . | trunc 53 | trimSuffix "-") -}}
{{- end -}}

{{/*
The DaemonSet's selector is k8s-app alone, as in upstream's manifest: a selector cannot change, so this
keeps `kubectl apply` over upstream's node-local-dns DaemonSet (or an older one of ours) working.
*/}}
{{- define "node-local-dns.selectorLabels" -}}
k8s-app: {{ include "node-local-dns.fullname" . }}
{{- end -}}

{{- define "node-local-dns.podLabels" -}}
{{ include "node-local-dns.selectorLabels" . }}
app.kubernetes.io/name: {{ include "node-local-dns.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* podLabels of the values, checked: they go beside the selector's, never over it. */}}
{{- define "node-local-dns.extraPodLabels" -}}
{{- with .Values.podLabels -}}
{{- if hasKey . "k8s-app" -}}{{- fail "podLabels: k8s-app is the DaemonSet's selector; set it with fullnameOverride" -}}{{- end -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}

{{- define "node-local-dns.labels" -}}
{{ include "node-local-dns.podLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "node-local-dns.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
Addresses, each given once in values.yaml. localIP and clusterDNS may be lists or comma-separated strings;
these helpers return them comma-separated, as node-cache's flags take them.
*/}}
{{- define "node-local-dns.list" -}}
{{- if kindIs "string" . -}}
{{- $items := list -}}
{{- range splitList "," . -}}{{- if trim . -}}{{- $items = append $items (trim .) -}}{{- end -}}{{- end -}}
{{- join "," $items -}}
{{- else -}}
{{- join "," . -}}
{{- end -}}
{{- end -}}

{{- define "node-local-dns.localIPs" -}}
{{- $ips := include "node-local-dns.list" .Values.localIP -}}
{{- if not $ips -}}{{- fail "localIP: give at least one node-local address" -}}{{- end -}}
{{- $ips -}}
{{- end -}}

{{- define "node-local-dns.clusterDNS" -}}
{{- $ips := include "node-local-dns.list" .Values.clusterDNS -}}
{{- if not $ips -}}{{- fail "clusterDNS: give the kube-dns Service's ClusterIPs" -}}{{- end -}}
{{- $ips -}}
{{- end -}}

{{/* The first local address: health, ready and the probes. */}}
{{- define "node-local-dns.probeIP" -}}
{{- first (splitList "," (include "node-local-dns.localIPs" .)) -}}
{{- end -}}

{{/* kube-proxy's mode, checked. */}}
{{- define "node-local-dns.mode" -}}
{{- $mode := .Values.kubeProxyMode -}}
{{- if not (has $mode (list "iptables" "nftables" "ipvs")) -}}
{{- fail (printf "kubeProxyMode: %q is not iptables, nftables or ipvs" $mode) -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{/*
Whether the cache takes the kube-dns ClusterIPs over from kube-proxy's DNAT with NOTRACK rules: in iptables
and nftables mode (where it writes table inet nodelocaldns over netlink, found without configuration). In
IPVS mode the ClusterIP stays on kube-ipvs0.
*/}}
{{- define "node-local-dns.takesClusterIP" -}}
{{- if ne (include "node-local-dns.mode" .) "ipvs" -}}true{{- end -}}
{{- end -}}

{{/* What the cache binds: the local addresses, and the kube-dns ClusterIPs where it takes them over. */}}
{{- define "node-local-dns.listenIPs" -}}
{{- if include "node-local-dns.takesClusterIP" . -}}
{{- printf "%s,%s" (include "node-local-dns.localIPs" .) (include "node-local-dns.clusterDNS" .) -}}
{{- else -}}
{{- include "node-local-dns.localIPs" . -}}
{{- end -}}
{{- end -}}

{{/* Whether the cluster serves prometheus-operator's API, or the user forces the object. */}}
{{- define "node-local-dns.monitoringAPI" -}}
{{- $cfg := index . 1 -}}
{{- $ctx := index . 0 -}}
{{- if and $cfg.enabled (or $cfg.force ($ctx.Capabilities.APIVersions.Has "monitoring.coreos.com/v1")) -}}
true
{{- else if $cfg.enabled -}}
{{- fail (printf "%s.enabled: the cluster does not serve monitoring.coreos.com/v1 (install prometheus-operator's CRDs, or set %s.force=true)" (index . 2) (index . 2)) -}}
{{- end -}}
{{- end -}}

{{/* Label matchers of the cache's and the guard's scrape targets, for the alerts. */}}
{{- define "node-local-dns.cacheSelector" -}}
{{- .Values.prometheusRule.cacheSelector | default (printf "job=%q,endpoint=\"metrics\"" (include "node-local-dns.fullname" .)) -}}
{{- end -}}
{{- define "node-local-dns.guardSelector" -}}
{{- .Values.prometheusRule.guardSelector | default (printf "job=%q,endpoint=\"guard-metrics\"" (include "node-local-dns.fullname" .)) -}}
{{- end -}}

{{/*
Options of a forward directive from a map (forward.options, zones[].options), sorted by name, one line each:
true writes the option alone, false or null leaves it out, a list gives its items as arguments.
*/}}
{{- define "node-local-dns.forwardOptions" -}}
{{- range $k, $v := . }}
{{- if kindIs "bool" $v }}
{{- if $v }}
{{ $k }}
{{- end }}
{{- else if kindIs "slice" $v }}
{{ $k }} {{ join " " $v }}
{{- else if not (kindIs "invalid" $v) }}
{{ $k }} {{ $v }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A forward directive: (list TO OPTIONS-LINES), with a block when there are options. */}}
{{- define "node-local-dns.forward" -}}
{{- $lines := index . 1 | trim -}}
forward . {{ index . 0 }}
{{- if $lines }} {
{{ $lines | indent 4 }}
}
{{- end }}
{{- end -}}

{{/*
serve_stale of wirecache (DURATION TTL WAIT [prefer_positive]) and of the cache plugin (DURATION verify WAIT
TTL, and serve_stale_policy prefer_positive), as serveStale sets them, or nothing when it is off;
corefile.Template's wireCacheServeStale and cacheServeStale.
*/}}
{{- define "node-local-dns.wirecacheServeStale" -}}
{{- with .Values.serveStale }}{{ if .enabled }}serve_stale {{ .for }} {{ .ttl }} {{ .verify }}{{ if .preferPositive }} prefer_positive{{ end }}{{ end }}{{ end -}}
{{- end -}}
{{- define "node-local-dns.cacheServeStale" -}}
{{- with .Values.serveStale }}{{ if .enabled }}serve_stale {{ .for }} verify {{ .verify }} {{ .ttl }}{{ if .preferPositive }}
serve_stale_policy prefer_positive{{ end }}{{ end }}{{ end -}}
{{- end -}}

{{/*
A size in KiB as internal/bytesize.Format writes it: in the largest unit it is a whole number of (GiB, MiB,
KiB).
*/}}
{{- define "node-local-dns.kib" -}}
{{- if eq (mod . 1048576) 0 -}}{{ div . 1048576 }}GiB
{{- else if eq (mod . 1024) 0 -}}{{ div . 1024 }}MiB
{{- else -}}{{ . }}KiB
{{- end -}}
{{- end -}}

{{/*
A server block's wirecache, its only cache: (list ROOT KIB), at most KIB KiB of answers (its share of
cacheMemoryMiB), an entry count that lets the bytes bind first (one per 256 bytes), tcpConnections when set
(wirecache's defaults, 1024 and 128, where one is 0), and serve_stale;
corefile.Template's wireCache.
*/}}
{{- define "node-local-dns.wirecache" -}}
{{- $kib := index . 1 -}}
wirecache {
    capacity {{ div (mul $kib 1024) 256 }}
    max_memory {{ include "node-local-dns.kib" $kib }}
    {{- with (index . 0).Values.tcpConnections }}{{ if or .max .perClient }}
    {{- $max := .max | default 1024 | int }}
    tcp_connections {{ $max }} {{ .perClient | default (min $max 128) }}
    {{- end }}{{ end }}
    {{- with include "node-local-dns.wirecacheServeStale" (index . 0) }}
    {{ . }}
    {{- end }}
}
{{- end -}}

{{/* A clamp directive: (list SUCCESS-MIN SUCCESS-MAX DENIAL-MIN DENIAL-MAX), TTLs in seconds. */}}
{{- define "node-local-dns.clamp" -}}
clamp {
    success {{ index . 0 }} {{ index . 1 }}
    denial {{ index . 2 }} {{ index . 3 }}
}
{{- end -}}

{{/*
The cache of a block other than the cluster domain's: (list ROOT KIB TTL), its wirecache with KIB KiB of the
budget, and clamp keeping every TTL inside [5, TTL] (TTL itself when it is lower), the window of its answers
and of wirecache's entries; corefile.Template's `other`.
*/}}
{{- define "node-local-dns.otherCache" -}}
{{- $ttl := int (index . 2) -}}
{{ include "node-local-dns.wirecache" (list (index . 0) (index . 1)) }}
{{ include "node-local-dns.clamp" (list (min 5 $ttl) $ttl (min 5 $ttl) $ttl) }}
{{- end -}}

{{/*
The cache plugin's prefetch, where the cache plugin still caches: the cluster domain's block with queryLog,
where wirecache steps aside. Elsewhere wirecache is the only cache and has no prefetch, so prefetch without
queryLog is refused rather than left out.
*/}}
{{- define "node-local-dns.prefetch" -}}
{{- with .Values.cache.prefetch }}{{ if .enabled }}prefetch {{ .amount }} {{ .duration }} {{ .percentage }}%{{ end }}{{ end -}}
{{- end -}}

{{/* The directives after the cache in every block: hosts, reload, loop and bind. */}}
{{- define "node-local-dns.tail" -}}
{{- if .Values.hosts -}}
hosts /etc/coredns/hosts {
    fallthrough
}
{{ end -}}
reload
loop
bind __PILLAR__LOCAL__DNS__{{ if include "node-local-dns.takesClusterIP" . }} __PILLAR__DNS__SERVER__{{ end }}
{{- end -}}

{{/* The hosts file of the ConfigMap, from hosts. */}}
{{- define "node-local-dns.hostsFile" -}}
{{- range .Values.hosts }}
{{ .ip }} {{ join " " .names }}
{{- end }}
{{- end -}}

{{/* Names of a zones entry: a list or a string of names separated by spaces. */}}
{{- define "node-local-dns.zoneNames" -}}
{{- if kindIs "string" . -}}{{- join " " (splitList " " . | compact) -}}{{- else -}}{{- join " " . -}}{{- end -}}
{{- end -}}

{{/*
The Corefile template of the node-local-dns ConfigMap. With cacheMemoryMiB and the cache, serveStale and
queryLog values alone set it is corefile.Template of the configuration they describe (examples/kubernetes's
tests check it): wirecache is each block's only cache, with its share of cacheMemoryMiB (corefile's
blockShares: 10/16 to the cluster domain, 4/16 to `.`, 1/16 to each reverse zone), and clamp bounds the TTLs;
with queryLog the cluster domain's block has log and the cache plugin instead of wirecache. hosts, prefetch,
forward, zones (each a block like a stub domain's: `.`'s share and clamp) and extraServerBlocks add to it what
that package does not write. node-cache fills in the __PILLAR__ and __PROMETHEUS__ variables from its flags,
adds notrack after every bind and turns `forward . __PILLAR__CLUSTER__DNS__` into upstreamsvc.
*/}}
{{- define "node-local-dns.corefile" -}}
{{- $clusterOptions := "force_tcp" -}}
{{- with .Values.upstreamMaxAttempts }}{{ $clusterOptions = printf "%s\nmax_connect_attempts %d" $clusterOptions (int .) }}{{ end -}}
{{- $clusterForward := include "node-local-dns.forward" (list "__PILLAR__CLUSTER__DNS__" $clusterOptions) -}}
{{- if and .Values.serveStale.preferPositive (not .Values.serveStale.enabled) -}}
{{- fail "serveStale.preferPositive: prefer_positive is a policy of serve_stale, which serveStale.enabled=false leaves out" -}}
{{- end -}}
{{- $c := .Values.cache -}}
{{- /* A sixteenth of the budget, in KiB. */ -}}
{{- $kib := mul (int .Values.cacheMemoryMiB) 64 -}}
{{- if and $c.prefetch.enabled (not .Values.queryLog) -}}
{{- fail "cache.prefetch.enabled: prefetch is the cache plugin's, which caches only the cluster domain's block and only with queryLog=true; everywhere else wirecache is the only cache, and it has no prefetch" -}}
{{- end -}}
{{ .Values.domain }}:53 {
    errors
    {{- if .Values.queryLog }}
    log
    {{- else }}
    {{- include "node-local-dns.wirecache" (list . (mul $kib 10)) | nindent 4 }}
    {{- end }}
    {{- include "node-local-dns.clamp" (list 5 $c.success.ttl 5 $c.denial.ttl) | nindent 4 }}
    {{- if .Values.queryLog }}
    cache {
        success {{ $c.success.capacity }} {{ $c.success.ttl }}
        denial {{ $c.denial.capacity }} {{ $c.denial.ttl }}
        {{- with include "node-local-dns.prefetch" . }}
        {{ . }}
        {{- end }}
        {{- with include "node-local-dns.cacheServeStale" . }}
        {{- . | nindent 8 }}
        {{- end }}
    }
    {{- end }}
    {{- include "node-local-dns.tail" . | nindent 4 }}
    {{- $clusterForward | nindent 4 }}
    prometheus __PROMETHEUS__ENDPOINT__
    health __PILLAR__LOCAL__DNS__:{{ .Values.ports.health }}
    ready __PILLAR__LOCAL__DNS__:{{ .Values.ports.ready }}
}
{{- range list "in-addr.arpa" "ip6.arpa" }}

{{ . }}:53 {
    errors
    {{- include "node-local-dns.otherCache" (list $ $kib $c.otherTTL) | nindent 4 }}
    {{- include "node-local-dns.tail" $ | nindent 4 }}
    {{- $clusterForward | nindent 4 }}
    prometheus __PROMETHEUS__ENDPOINT__
}
{{- end }}

.:53 {
    errors
    {{- include "node-local-dns.otherCache" (list . (mul $kib 4) $c.otherTTL) | nindent 4 }}
    {{- include "node-local-dns.tail" . | nindent 4 }}
    {{- $upstreams := .Values.forward.upstreams | default (list "__PILLAR__UPSTREAM__SERVERS__") }}
    {{- include "node-local-dns.forward" (list (join " " $upstreams) (include "node-local-dns.forwardOptions" .Values.forward.options)) | nindent 4 }}
    prometheus __PROMETHEUS__ENDPOINT__
}
{{- range .Values.zones }}
{{- $names := include "node-local-dns.zoneNames" .zones }}
{{- if not $names }}{{ fail "zones: an entry without zones" }}{{ end }}
{{- if not .servers }}{{ fail (printf "zones: %s has no servers" $names) }}{{ end }}

{{ range $i, $z := splitList " " $names }}{{ if $i }} {{ end }}{{ $z }}:53{{ end }} {
    errors
    {{- $ttl := ternary .cacheTTL $c.otherTTL (hasKey . "cacheTTL") }}
    {{- if $ttl }}
    {{- include "node-local-dns.otherCache" (list $ (mul $kib 4) $ttl) | nindent 4 }}
    {{- end }}
    {{- include "node-local-dns.tail" $ | nindent 4 }}
    {{- include "node-local-dns.forward" (list (join " " .servers) (include "node-local-dns.forwardOptions" (.options | default dict))) | nindent 4 }}
    prometheus __PROMETHEUS__ENDPOINT__
}
{{- end }}
{{- with .Values.extraServerBlocks }}

{{ . | trim }}
{{- end }}
{{ end -}}
