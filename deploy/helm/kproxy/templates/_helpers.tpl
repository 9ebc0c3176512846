{{/* Names and labels. */}}
{{- define "kproxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kproxy.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kproxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kproxy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "kproxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The pods kproxy runs in: its own (gateway) or the broker pods (sidecar). */}}
{{- define "kproxy.podSelector" -}}
{{- if eq .Values.mode "sidecar" }}
{{- toYaml .Values.sidecar.brokerPodLabels }}
{{- else }}
{{- include "kproxy.selectorLabels" . }}
{{- end }}
{{- end }}

{{- define "kproxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kproxy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kproxy.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Mount points. */}}
{{- define "kproxy.configDir" -}}/etc/kproxy/config{{- end }}
{{- define "kproxy.serverTLSDir" -}}/etc/kproxy/tls/server{{- end }}
{{- define "kproxy.upstreamTLSDir" -}}/etc/kproxy/tls/upstream{{- end }}
{{- define "kproxy.adminTokenDir" -}}/etc/kproxy/admin{{- end }}
{{- define "kproxy.captureDir" -}}/var/lib/kproxy/capture{{- end }}

{{/*
Checks that stop `helm install` with one line naming the value to set, before anything
reaches the cluster. kproxy would refuse most of these at start too, but only after the
rollout, in a crash loop.
*/}}
{{- define "kproxy.validate" -}}
{{- $v := .Values }}
{{- if not (has $v.mode (list "gateway" "sidecar")) }}
{{- fail (printf "mode: must be gateway or sidecar, got %q" $v.mode) }}
{{- end }}
{{- if not (has $v.routing (list "ports" "sni")) }}
{{- fail (printf "routing: must be ports or sni, got %q" $v.routing) }}
{{- end }}
{{- if and (eq $v.mode "gateway") (not $v.upstream) }}
{{- fail "upstream: required in gateway mode: HOST:PORT of the cluster's brokers or bootstrap Service (e.g. my-cluster-kafka-bootstrap.kafka.svc:9092)" }}
{{- end }}
{{- if eq $v.routing "sni" }}
{{- if not (and $v.sni.hostTemplate $v.sni.bootstrapHost) }}
{{- fail "sni.hostTemplate and sni.bootstrapHost: required with routing: sni (e.g. broker-{node_id}.kafka.example.com and bootstrap.kafka.example.com)" }}
{{- end }}
{{- if not (and $v.tls.server.enabled $v.tls.server.secretName) }}
{{- fail "tls.server: routing: sni reads the server name from the TLS handshake, so it needs tls.server.enabled and tls.server.secretName (a certificate for every broker name, or a wildcard)" }}
{{- end }}
{{- if $v.advertisedHost }}
{{- fail "advertisedHost: not used with routing: sni (brokers are advertised by sni.hostTemplate); leave it empty" }}
{{- end }}
{{- else if eq $v.mode "gateway" }}
{{- $host := tpl (required "advertisedHost: required in gateway mode: the host name clients use to reach this chart's Service (e.g. <release>-kproxy.<namespace>.svc.cluster.local in the cluster, or the load balancer's DNS name); kproxy hands it to clients for every broker" $v.advertisedHost) . }}
{{- if has (trimAll "[]" $host) (list "0.0.0.0" "::" "") }}
{{- fail (printf "advertisedHost: %q is not an address clients can reach (they would connect to themselves); give the Service's DNS name or the load balancer's" $host) }}
{{- end }}
{{- if not $v.brokers.nodeIds }}
{{- fail "brokers.nodeIds: list the brokers' node ids (Strimzi: 0, 1, 2...; MSK: 1, 2, 3...) so the Service exposes a port for each" }}
{{- end }}
{{- range $v.brokers.nodeIds }}
{{- if gt (add $v.brokers.portBase .) 65535 }}
{{- fail (printf "brokers.portBase + node id %v is past 65535" .) }}
{{- end }}
{{- end }}
{{- end }}
{{- if eq $v.mode "gateway" }}
{{- if lt (int $v.gateway.replicas) 2 }}
{{- fail "gateway.replicas: at least 2, so a node drain or a rollout is not an outage" }}
{{- end }}
{{- if and $v.gateway.autoscaling.enabled (lt (int $v.gateway.autoscaling.minReplicas) 2) }}
{{- fail "gateway.autoscaling.minReplicas: at least 2" }}
{{- end }}
{{- end }}
{{- if and $v.tls.server.clientAuth (not $v.tls.server.enabled) }}
{{- fail "tls.server.clientAuth: needs tls.server.enabled" }}
{{- end }}
{{- if and $v.tls.server.enabled (not $v.tls.server.secretName) }}
{{- fail "tls.server.secretName: required with tls.server.enabled (a kubernetes.io/tls Secret: tls.crt, tls.key, ca.crt)" }}
{{- end }}
{{- if and $v.tls.upstream.clientCert (not $v.tls.upstream.secretName) }}
{{- fail "tls.upstream.secretName: required with tls.upstream.clientCert (tls.crt and tls.key of kproxy's client certificate)" }}
{{- end }}
{{- range $key := list "listen" "admin_listen" "probe_listen" "upstream" "mode" "routing" "advertised_host" "advertised_host_template" "sni_host_template" "sni_bootstrap_host" "broker_port_base" "broker_port_rule" "tls_server" "tls_client" "admin_token" "admin_token_file" "capture_root" }}
{{- if hasKey $v.config $key }}
{{- fail (printf "config.%s: set by the chart's own values (ports, upstream, mode, routing, advertisedHost, brokers, sni, tls, adminToken, capture), not under config" $key) }}
{{- end }}
{{- end }}
{{- end }}

{{/* kproxy's config file: every setting but the listen addresses (env, see below). */}}
{{- define "kproxy.config" -}}
{{- $v := .Values }}
{{- $c := dict "mode" $v.mode "upstream" $v.upstream "routing" $v.routing "capture_root" (include "kproxy.captureDir" .) }}
{{- if eq $v.mode "sidecar" }}
{{- $_ := set $c "upstream" (default "127.0.0.1:9092" $v.upstream) }}
{{- end }}
{{- if eq $v.routing "sni" }}
{{- $_ := set $c "sni_host_template" $v.sni.hostTemplate }}
{{- $_ := set $c "sni_bootstrap_host" $v.sni.bootstrapHost }}
{{- else if eq $v.mode "gateway" }}
{{- $_ := set $c "advertised_host" (tpl $v.advertisedHost .) }}
{{- $_ := set $c "broker_port_rule" "offset" }}
{{- $_ := set $c "broker_port_base" $v.brokers.portBase }}
{{- else }}
{{- $_ := set $c "advertised_host_template" (tpl $v.sidecar.advertisedHostTemplate .) }}
{{- $_ := set $c "broker_port_rule" "fixed" }}
{{- end }}
{{- if $v.tls.server.enabled }}
{{- $dir := include "kproxy.serverTLSDir" . }}
{{- $t := dict "cert_file" (printf "%s/tls.crt" $dir) "key_file" (printf "%s/tls.key" $dir) }}
{{- if $v.tls.server.clientAuth }}
{{- $_ := set $t "client_ca_file" (printf "%s/ca.crt" $dir) }}
{{- end }}
{{- $_ := set $c "tls_server" $t }}
{{- end }}
{{- if $v.tls.upstream.enabled }}
{{- $dir := include "kproxy.upstreamTLSDir" . }}
{{- $t := dict "check_hostname" $v.tls.upstream.checkHostname }}
{{- if $v.tls.upstream.secretName }}
{{- $_ := set $t "ca_file" (printf "%s/%s" $dir $v.tls.upstream.caKey) }}
{{- end }}
{{- if $v.tls.upstream.clientCert }}
{{- $_ := set $t "cert_file" (printf "%s/tls.crt" $dir) }}
{{- $_ := set $t "key_file" (printf "%s/tls.key" $dir) }}
{{- end }}
{{- $_ := set $c "tls_client" $t }}
{{- end }}
{{- if $v.adminToken.existingSecret }}
{{- $_ := set $c "admin_token_file" (printf "%s/%s" (include "kproxy.adminTokenDir" .) $v.adminToken.key) }}
{{- end }}
{{- toYaml (merge $c $v.config) }}
{{- end }}

{{/*
The kproxy container, the same in the gateway's pods and beside each broker. Listen
addresses are env vars: the image sets KPROXY_LISTEN/ADMIN_LISTEN/PROBE_LISTEN, and env
beats the config file.
*/}}
{{- define "kproxy.container" -}}
name: kproxy
image: {{ include "kproxy.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
args:
  - --config={{ include "kproxy.configDir" . }}/kproxy.yaml
env:
  - name: KPROXY_LISTEN
    value: "0.0.0.0:{{ .Values.ports.kafka }}"
  - name: KPROXY_ADMIN_LISTEN
    value: "0.0.0.0:{{ .Values.ports.admin }}"
  - name: KPROXY_PROBE_LISTEN
    value: "0.0.0.0:{{ .Values.ports.probes }}"
ports:
  - {name: kproxy-kafka, containerPort: {{ .Values.ports.kafka }}}
{{- if and (eq .Values.mode "gateway") (eq .Values.routing "ports") }}
{{- range .Values.brokers.nodeIds }}
  - {name: {{ printf "broker-%v" . | quote }}, containerPort: {{ add $.Values.brokers.portBase . }}}
{{- end }}
{{- end }}
  - {name: kproxy-admin, containerPort: {{ .Values.ports.admin }}}
  - {name: kproxy-probes, containerPort: {{ .Values.ports.probes }}}
livenessProbe:                          # the event loop turns
  httpGet: {path: /healthz, port: kproxy-probes}
  {{- toYaml .Values.livenessProbe | nindent 2 }}
readinessProbe:                         # broker listeners bound, an upstream answers
  httpGet: {path: /readyz, port: kproxy-probes}
  {{- toYaml .Values.readinessProbe | nindent 2 }}
resources:
  {{- toYaml .Values.resources | nindent 2 }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
volumeMounts:
  - {name: kproxy-config, mountPath: {{ include "kproxy.configDir" . }}, readOnly: true}
  - {name: kproxy-capture, mountPath: {{ include "kproxy.captureDir" . }}}
{{- if .Values.tls.server.enabled }}
  - {name: kproxy-tls-server, mountPath: {{ include "kproxy.serverTLSDir" . }}, readOnly: true}
{{- end }}
{{- if and .Values.tls.upstream.enabled .Values.tls.upstream.secretName }}
  - {name: kproxy-tls-upstream, mountPath: {{ include "kproxy.upstreamTLSDir" . }}, readOnly: true}
{{- end }}
{{- if .Values.adminToken.existingSecret }}
  - {name: kproxy-admin-token, mountPath: {{ include "kproxy.adminTokenDir" . }}, readOnly: true}
{{- end }}
{{- end }}

{{/* The volumes the kproxy container mounts. */}}
{{- define "kproxy.volumes" -}}
- name: kproxy-config
  configMap:
    name: {{ include "kproxy.fullname" . }}
- name: kproxy-capture
  emptyDir: {sizeLimit: {{ .Values.capture.sizeLimit }}}
{{- if .Values.tls.server.enabled }}
- name: kproxy-tls-server
  secret:
    secretName: {{ .Values.tls.server.secretName }}
{{- end }}
{{- if and .Values.tls.upstream.enabled .Values.tls.upstream.secretName }}
- name: kproxy-tls-upstream
  secret:
    secretName: {{ .Values.tls.upstream.secretName }}
{{- end }}
{{- if .Values.adminToken.existingSecret }}
- name: kproxy-admin-token
  secret:
    secretName: {{ .Values.adminToken.existingSecret }}
{{- end }}
{{- end }}

{{/* For a parent chart's broker StatefulSet (sidecar mode). */}}
{{- define "kproxy.sidecar.container" -}}
{{- include "kproxy.container" . }}
{{- end }}
{{- define "kproxy.sidecar.volumes" -}}
{{- include "kproxy.volumes" . }}
{{- end }}
