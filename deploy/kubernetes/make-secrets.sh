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
# applied (no cluster needed). Needs openssl, kubectl and sha256sum.
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
apply() {
  if [ "${DRY_RUN:-0}" = 1 ]; then
    kubectl create secret generic "$@" --namespace "$ns" --dry-run=client -o yaml
    echo ---
  else
    kubectl create secret generic "$@" --namespace "$ns" --dry-run=client -o yaml | kubectl apply -f -
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
apply tidegate-etcd-server --from-file=ca.crt=ca.crt --from-file=tls.crt=etcd-server.crt \
  --from-file=tls.key=etcd-server.key
apply tidegate-etcd-client --from-file=ca.crt=ca.crt --from-file=tls.crt=etcd-client.crt \
  --from-file=tls.key=etcd-client.key
rm -f ./*.csr ./*.srl etcd-server.key etcd-client.key

# Admin API (SRE CLI): the control planes hold the tokens; the CLI reads them from OUTDIR.
token > operator.token
token > viewer.token
printf '%s,%s,%s\n' "$(cat operator.token)" sre-operator operator "$(cat viewer.token)" sre-viewer viewer \
  > tokens.csv
apply tidegate-admin-tokens --from-file=tokens.csv=tokens.csv
rm -f tokens.csv

# Telemetry: one token per engine Deployment; the control planes see only its SHA-256.
: > credentials.csv
for engine in "${engines[@]}"; do
  t=$(token)
  printf '%s,%s,%s\n' "$engine" "$(printf %s "$t" | sha256sum | cut -d' ' -f1)" "$engine-*" >> credentials.csv
  printf %s "$t" > agent.token
  apply "tidegate-agent-$engine" --from-file=token=agent.token
  rm -f agent.token
done
apply tidegate-telemetry-credentials --from-file=credentials.csv=credentials.csv
echo "secrets for namespace $ns made; SRE CLI tokens in $out/operator.token and $out/viewer.token" >&2
