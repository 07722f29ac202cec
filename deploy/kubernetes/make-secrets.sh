#!/usr/bin/env bash
# Create the Secrets that deploy/kubernetes expects, with fresh random tokens and a private CA
# for etcd. Nothing secret is ever stored in git; run this once per cluster (docs/DEPLOY.md).
#
#   deploy/kubernetes/make-secrets.sh NAMESPACE OUTDIR [ENGINE...]
#
# ENGINE: the engine Deployments whose agents stream telemetry (default: vllm-llama-8b). Each
# gets its own token (Secret tidegate-agent-ENGINE), allowed to speak for replica ids ENGINE-*
# (its pod names). OUTDIR receives the CA and the operator/viewer tokens for the SRE CLI (mode
# 0600); keep it safe or delete it. With DRY_RUN=1 the Secrets are printed as YAML instead of
# applied (no cluster, no kubectl needed). Needs openssl (and kubectl to apply).
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,12p' "$0" >&2
  exit 2
fi
ns=$1 out=$2
shift 2
engines=("${@:-vllm-llama-8b}")
umask 077
mkdir -p "$out"
cd "$out"

token() { openssl rand -base64 32 | tr -d '\n=' | tr '+/' '-_'; }
# secret NAME KEY=FILE...: an Opaque Secret as YAML (what `kubectl create secret generic
# --from-file` makes), so that DRY_RUN needs no kubectl.
secret() {
  printf 'apiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: %s\ntype: Opaque\ndata:\n' "$1" "$ns"
  shift
  for kv in "$@"; do
    printf '  %s: %s\n' "${kv%%=*}" "$(base64 < "${kv#*=}" | tr -d '\n')"
  done
}
apply() {
  if [ "${DRY_RUN:-0}" = 1 ]; then
    secret "$@"
    echo ---
  else
    secret "$@" | kubectl apply -f -
  fi
}

# etcd: a private CA, one certificate for every member (server and peer), one for the clients.
openssl req -x509 -newkey rsa:3072 -nodes -days 3650 -subj "/CN=tidegate-etcd-ca" \
  -keyout ca.key -out ca.crt 2>/dev/null
svc=tidegate-etcd
sans="DNS:$svc,DNS:$svc.$ns,DNS:$svc.$ns.svc,DNS:$svc.$ns.svc.cluster.local"
sans="$sans,DNS:*.$svc,DNS:*.$svc.$ns.svc,DNS:*.$svc.$ns.svc.cluster.local,DNS:localhost,IP:127.0.0.1"
openssl req -newkey rsa:3072 -nodes -subj "/CN=$svc" -keyout etcd-server.key -out etcd-server.csr 2>/dev/null
openssl x509 -req -in etcd-server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \
  -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$sans") \
  -out etcd-server.crt 2>/dev/null
openssl req -newkey rsa:3072 -nodes -subj "/CN=tidegate" -keyout etcd-client.key -out etcd-client.csr 2>/dev/null
openssl x509 -req -in etcd-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \
  -extfile <(printf 'extendedKeyUsage=clientAuth\n') -out etcd-client.crt 2>/dev/null
apply tidegate-etcd-server ca.crt=ca.crt tls.crt=etcd-server.crt tls.key=etcd-server.key
apply tidegate-etcd-client ca.crt=ca.crt tls.crt=etcd-client.crt tls.key=etcd-client.key
rm -f ./*.csr ./*.srl etcd-server.key etcd-client.key

# Admin API (SRE CLI): the control planes hold the tokens; the CLI reads them from OUTDIR.
token > operator.token
token > viewer.token
printf '%s,%s,%s\n' "$(cat operator.token)" sre-operator operator "$(cat viewer.token)" sre-viewer viewer \
  > tokens.csv
apply tidegate-admin-tokens tokens.csv=tokens.csv
rm -f tokens.csv

# Telemetry: one token per engine Deployment; the control planes see only its SHA-256.
: > credentials.csv
for engine in "${engines[@]}"; do
  t=$(token)
  digest=$(printf %s "$t" | openssl dgst -sha256 -r | cut -d' ' -f1)
  printf '%s,%s,%s\n' "$engine" "$digest" "$engine-*" >> credentials.csv
  printf %s "$t" > agent.token
  apply "tidegate-agent-$engine" token=agent.token
  rm -f agent.token
done
apply tidegate-telemetry-credentials credentials.csv=credentials.csv
echo "secrets for namespace $ns made; SRE CLI tokens in $out/operator.token and $out/viewer.token" >&2
