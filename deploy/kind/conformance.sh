#!/usr/bin/env bash
# Runs kube-proxy's upstream sig-network e2e tests (the set of
# `cargo xtask conformance`, docs/conformance.md) against ebpf-kube-proxy
# in a kind cluster without kube-proxy, on each datapath, and prints the
# table: upstream test | eBPF | nftables.
#
# Needs: docker, kind, kubectl, jq, and an e2e.test binary matching the
# cluster's Kubernetes version (E2E_TEST=/path/to/e2e.test, e.g. from the
# kubernetes-test-linux-amd64.tar.gz release asset).
#
# Environment:
#   IMAGE         the image to build and load (default: ebpf-kube-proxy:dev,
#                 a local name; kind loads it, nothing is pushed)
#   PROXY_MODES   datapaths to run, in order (default: "ebpf nftables")
#   FOCUS / SKIP  ginkgo regexes (defaults below)
#   WITH_SERIAL=1, WITH_DISRUPTIVE=1
#                 also run the [Serial] / [Disruptive] tests
#   CLUSTER_NAME  kind cluster (default: ebpf-kube-proxy), created if missing
#   E2E_TEST      the e2e.test binary (default: e2e.test on PATH)
#   OUT_DIR       reports and logs (default: ./conformance-results)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
cluster="${CLUSTER_NAME:-ebpf-kube-proxy}"
image="${IMAGE:-ebpf-kube-proxy:dev}"
e2e_test="${E2E_TEST:-e2e.test}"
proxy_modes="${PROXY_MODES:-ebpf nftables}"
out_dir="${OUT_DIR:-${PWD}/conformance-results}"
focus="${FOCUS:-\[sig-network\] (Services|Conntrack|KubeProxy|Networking Granular Checks: Services|EndpointSlice|CVE-2021-29923)}"
# Nothing here provisions cloud load balancers.
skip="${SKIP:-\[Feature:LoadBalancer\]}"
if [ "${WITH_SERIAL:-0}" != 1 ]; then
  skip="${skip}|\[Serial\]"
fi
if [ "${WITH_DISRUPTIVE:-0}" != 1 ]; then
  skip="${skip}|\[Disruptive\]"
fi

for tool in docker kind kubectl jq; do
  command -v "${tool}" >/dev/null || { echo "missing: ${tool}" >&2; exit 1; }
done
command -v "${e2e_test}" >/dev/null || [ -x "${e2e_test}" ] || {
  echo "missing: e2e.test (set E2E_TEST)" >&2
  exit 1
}
for mode in ${proxy_modes}; do
  case "${mode}" in
    ebpf | nftables) ;;
    *) echo "PROXY_MODES: ebpf or nftables, not ${mode}" >&2; exit 1 ;;
  esac
done
mkdir -p "${out_dir}"

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

echo "==> loading ${image} into ${cluster}"
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

# Deploys the DaemonSet with KubeProxyConfiguration mode $1 and waits until
# every node runs the new pods.
deploy() {
  local mode="$1" manifests
  manifests="$(kubectl kustomize "${root}/deploy" \
    | sed -e "s|REPLACE-WITH-CONTROL-PLANE-ADDRESS|${apiserver_host}|" \
          -e "s|ghcr.io/example/ebpf-kube-proxy:0.1.0|${image}|" \
          -e "s|^\\( *\\)mode: \"\"$|\\1mode: \"${mode}\"|" \
    | filter_monitoring)"
  if ! grep -q "mode: \"${mode}\"" <<<"${manifests}"; then
    echo "could not set mode: \"${mode}\" in the ConfigMap (deploy/configmap.yaml)" >&2
    exit 1
  fi
  kubectl apply -f - <<<"${manifests}"
  kubectl -n kube-system rollout restart daemonset/ebpf-kube-proxy
  kubectl -n kube-system rollout status daemonset/ebpf-kube-proxy --timeout=5m
}

# name<TAB>result for each spec the run did not skip, from ginkgo's JSON
# report (the name as ginkgo prints it: the containers' texts, then the
# spec's).
results_of() {
  jq -r '.[].SpecReports[]?
    | select(.LeafNodeType == "It" and .State != "skipped" and .State != "pending")
    | [((.ContainerHierarchyTexts // []) + [.LeafNodeText] | join(" ")),
       (if .State == "passed" then "pass" else "FAIL (" + .State + ")" end)]
    | @tsv' "$1"
}

overall=0
for mode in ${proxy_modes}; do
  echo "==> ${mode}: deploying"
  deploy "${mode}"
  echo "==> ${mode}: running ${focus} (skip ${skip})"
  set +e
  "${e2e_test}" \
    --kubeconfig="${kubeconfig}" \
    --provider=skeleton \
    --ginkgo.focus="${focus}" \
    --ginkgo.skip="${skip}" \
    --ginkgo.no-color \
    --ginkgo.json-report="${out_dir}/${mode}.json" \
    --ginkgo.v 2>&1 | tee "${out_dir}/${mode}.log"
  status=${PIPESTATUS[0]}
  set -e
  grep -E '^(Ran [0-9]+ of [0-9]+ Specs|SUCCESS!|FAIL!)' "${out_dir}/${mode}.log" || true
  if [ "${status}" -ne 0 ]; then
    overall="${status}"
  fi
  results_of "${out_dir}/${mode}.json" | sort >"${out_dir}/${mode}.tsv"
done

# The same table as docs/conformance.md: one row per upstream test, one
# column per datapath ("not run" where a datapath did not run it).
echo
echo "| Upstream test | eBPF | nftables |"
echo "|---|---|---|"
for mode in ebpf nftables; do
  [ -f "${out_dir}/${mode}.tsv" ] || : >"${out_dir}/${mode}.tsv"
done
cut -f1 "${out_dir}/ebpf.tsv" "${out_dir}/nftables.tsv" | sort -u | while IFS= read -r name; do
  [ -n "${name}" ] || continue
  cell() {
    local found
    found="$(awk -F'\t' -v n="${name}" '$1 == n { print $2; exit }' "${out_dir}/$1.tsv")"
    printf '%s' "${found:-not run}"
  }
  printf '| %s | %s | %s |\n' "${name//|/\\|}" "$(cell ebpf)" "$(cell nftables)"
done
exit "${overall}"
