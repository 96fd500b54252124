#!/usr/bin/env bash
# Runs the upstream sig-network Services conformance tests against
# ebpf-kube-proxy in a kind cluster without kube-proxy.
#
# Needs: docker, kind, kubectl, and an e2e.test binary matching the
# cluster's Kubernetes version (E2E_TEST=/path/to/e2e.test, e.g. from the
# kubernetes-test-linux-amd64.tar.gz release asset).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
cluster="${CLUSTER_NAME:-ebpf-kube-proxy}"
image="${IMAGE:-ghcr.io/example/ebpf-kube-proxy:0.1.0}"
e2e_test="${E2E_TEST:-e2e.test}"
focus='\[sig-network\] Services.*\[Conformance\]'

for tool in docker kind kubectl; do
  command -v "${tool}" >/dev/null || { echo "missing: ${tool}" >&2; exit 1; }
done
command -v "${e2e_test}" >/dev/null || [ -x "${e2e_test}" ] || {
  echo "missing: e2e.test (set E2E_TEST)" >&2
  exit 1
}

echo "==> building ${image}"
docker build -f "${root}/deploy/Dockerfile" -t "${image}" "${root}"

if ! kind get clusters | grep -qx "${cluster}"; then
  echo "==> creating kind cluster ${cluster} (kubeProxyMode: none)"
  kind create cluster --name "${cluster}" --config "${here}/cluster.yaml"
fi
kubeconfig="$(mktemp)"
trap 'rm -f "${kubeconfig}"' EXIT
kind get kubeconfig --name "${cluster}" >"${kubeconfig}"
export KUBECONFIG="${kubeconfig}"

echo "==> loading the image and deploying"
kind load docker-image --name "${cluster}" "${image}"

# With no kube-proxy, the kubernetes Service's ClusterIP (10.96.0.1) is not
# translated until ebpf-kube-proxy runs, so the proxy talks to the API
# server on the control-plane node directly (deploy/apiserver.yaml).
apiserver_host="$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "${cluster}-control-plane")"
if [ -z "${apiserver_host}" ]; then
  echo "cannot find the address of ${cluster}-control-plane" >&2
  exit 1
fi
echo "    API server: ${apiserver_host}:6443"

have_podmonitor_crd=false
if kubectl get crd podmonitors.monitoring.coreos.com >/dev/null 2>&1; then
  have_podmonitor_crd=true
else
  echo "    no PodMonitor CRD in the cluster: skipping monitoring/podmonitor.yaml"
fi

# Copies the rendered manifests from stdin, without the PodMonitor
# document when the cluster has no Prometheus Operator CRDs.
filter_monitoring() {
  if [ "${have_podmonitor_crd}" = true ]; then
    cat
    return
  fi
  awk '
    function flush() {
      if (doc != "" && index("\n" doc, "\nkind: PodMonitor\n") == 0) {
        if (kept++) print "---"
        printf "%s", doc
      }
      doc = ""
    }
    /^---$/ { flush(); next }
    { doc = doc $0 "\n" }
    END { flush() }
  '
}

kubectl kustomize "${root}/deploy" \
  | sed -e "s|REPLACE-WITH-CONTROL-PLANE-ADDRESS|${apiserver_host}|" \
        -e "s|ghcr.io/example/ebpf-kube-proxy:0.1.0|${image}|" \
  | filter_monitoring \
  | kubectl apply -f -
kubectl -n kube-system rollout status daemonset/ebpf-kube-proxy --timeout=5m

echo "==> running: ${focus}"
set +e
"${e2e_test}" \
  --kubeconfig="${kubeconfig}" \
  --provider=skeleton \
  --ginkgo.focus="${focus}" \
  --ginkgo.skip='\[Serial\]' \
  --ginkgo.no-color \
  --ginkgo.v 2>&1 | tee e2e.log
status=${PIPESTATUS[0]}
set -e

echo "==> summary"
grep -E '^(Ran [0-9]+ of [0-9]+ Specs|SUCCESS!|FAIL!)' e2e.log || true
exit "${status}"
