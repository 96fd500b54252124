//! kube-proxy's upstream e2e tests (kubernetes/kubernetes
//! `test/e2e/network/{service,conntrack,kube_proxy,networking,
//! endpointslice,loadbalancer}.go` and the CVE-2021-29923 test), each as a
//! scenario of the bed under the name ginkgo prints for it. What the bed
//! stands in for: the exec pod is a pod netns (pod3 unless said), a
//! hostNetwork client is a process in the node netns and cgroup, a
//! hostNetwork endpoint is the node's own netexec, "pods created/deleted"
//! are EndpointSlice members added/removed, the API server is the file
//! source (or the fake API server where a scenario says so).

use crate::e2e::conformance::Case;

use super::two_node;
use super::upstream_conntrack as ct;
use super::upstream_more as more;
use super::upstream_services as svcs;
use super::upstream_two_node as two;
use super::*;

const NFT_ONLY_INVALID: &str = "the eBPF datapath does not NAT a pod's connection (socket-LB connects it to the endpoint), so no out-of-window packet can reach a client un-NATed";

pub fn conformance() -> Vec<Case> {
    let case = |name, run| Case {
        name,
        run,
        not_applicable: &[],
    };
    vec![
        // Services (service.go).
        case(
            "[sig-network] Services should serve a basic endpoint from pods [Conformance]",
            svcs::basic_endpoint,
        ),
        case(
            "[sig-network] Services should serve multiport endpoints from pods [Conformance]",
            multi_port,
        ),
        case(
            "[sig-network] Services should be updated after adding or deleting ports ",
            svcs::ports_added_and_removed,
        ),
        case(
            "[sig-network] Services should preserve source pod IP for traffic thru service cluster IP [LinuxOnly]",
            svcs::source_pod_ip_preserved,
        ),
        case(
            "[sig-network] Services should allow pods to hairpin back to themselves through services",
            hairpin,
        ),
        case(
            "[sig-network] Services should be able to up and down services",
            svcs::up_and_down,
        ),
        case(
            "[sig-network] Services should work after the service has been recreated",
            svcs::recreated,
        ),
        case(
            "[sig-network] Services should work after restarting kube-proxy [Disruptive]",
            restart,
        ),
        case(
            "[sig-network] Services should be able to create a functioning NodePort service [Conformance]",
            nodeport_outside,
        ),
        case(
            "[sig-network] Services should be possible to connect to a service via ExternalIP when the external IP is not assigned to a node",
            svcs::external_ip_not_on_a_node,
        ),
        case(
            "[sig-network] Services should serve endpoints on same port and different protocols [Conformance]",
            svcs::same_port_different_protocols,
        ),
        case(
            "[sig-network] Services should be able to change the type from ExternalName to ClusterIP [Conformance]",
            svcs::external_name_to_cluster_ip,
        ),
        case(
            "[sig-network] Services should have session affinity timeout work for service with type clusterIP [LinuxOnly] [Conformance]",
            session_affinity,
        ),
        case(
            "[sig-network] Services should have session affinity work for service with type clusterIP [LinuxOnly] [Conformance]",
            more::affinity_cluster_ip,
        ),
        case(
            "[sig-network] Services should be able to switch session affinity for service with type clusterIP [LinuxOnly] [Conformance]",
            more::affinity_switch_cluster_ip,
        ),
        case(
            "[sig-network] Services should have session affinity work for NodePort service [LinuxOnly] [Conformance]",
            more::affinity_node_port,
        ),
        case(
            "[sig-network] Services should be able to switch session affinity for NodePort service [LinuxOnly] [Conformance]",
            more::affinity_switch_node_port,
        ),
        case(
            "[sig-network] Services should be able to change the type from ExternalName to NodePort [Conformance]",
            more::external_name_to_node_port,
        ),
        case(
            "[sig-network] Services should respect internalTrafficPolicy=Local Pod and Node, to Pod (hostNetwork: true)",
            more::itp_local_to_host_network_endpoint,
        ),
        case(
            "[sig-network] Services should fallback to terminating endpoints when there are no ready endpoints with internalTrafficPolicy=Cluster",
            more::terminating_fallback_cluster,
        ),
        case(
            "[sig-network] Services should fallback to local terminating endpoints when there are no ready endpoints with internalTrafficPolicy=Local",
            more::terminating_fallback_local,
        ),
        case(
            // "externall" is upstream's spelling.
            "[sig-network] Services should fallback to terminating endpoints when there are no ready endpoints with externallTrafficPolicy=Cluster",
            two::etp_cluster_terminating_fallback,
        ),
        case(
            "[sig-network] Services should fallback to local terminating endpoints when there are no ready endpoints with externalTrafficPolicy=Local",
            two::etp_local_terminating_fallback,
        ),
        case(
            "[sig-network] Services should implement service.kubernetes.io/service-proxy-name",
            svcs::service_proxy_name_label,
        ),
        case(
            "[sig-network] Services should implement service.kubernetes.io/headless",
            svcs::headless_label,
        ),
        case(
            "[sig-network] Services should be rejected when no endpoints exist",
            svcs::rejected_without_endpoints,
        ),
        case(
            "[sig-network] Services should respect internalTrafficPolicy=Local Pod to Pod",
            svcs::itp_local_pod_to_pod,
        ),
        case(
            "[sig-network] Services should respect internalTrafficPolicy=Local Pod (hostNetwork: true) to Pod",
            itp_local,
        ),
        case(
            "[sig-network] Services should fail health check node port if there are only terminating endpoints",
            two_node::health_check_node_port_flips,
        ),
        case(
            "[sig-network] Services should implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes",
            two::etp_changes_and_the_nodes_own_client,
        ),
        case(
            "[sig-network] CVE-2021-29923 IPv4 Service Type ClusterIP with leading zeros should work interpreted as decimal",
            svcs::leading_zero_cluster_ip,
        ),
        // Networking Granular Checks: Services (networking.go).
        case(
            "[sig-network] Networking Granular Checks: Services should function for pod-Service: http",
            svcs::pod_to_service_tcp,
        ),
        case(
            "[sig-network] Networking Granular Checks: Services should function for pod-Service: udp",
            svcs::pod_to_service_udp,
        ),
        case(
            "[sig-network] Networking Granular Checks: Services should function for node-Service: http",
            clusterip_tcp,
        ),
        case(
            "[sig-network] Networking Granular Checks: Services should function for node-Service: udp",
            clusterip_udp,
        ),
        case(
            "[sig-network] Networking Granular Checks: Services should update endpoints: http",
            endpoint_churn,
        ),
        case(
            "[sig-network] Networking Granular Checks: Services should update endpoints: udp",
            more::update_endpoints_udp,
        ),
        case(
            "[sig-network] Networking Granular Checks: Services should support basic nodePort: udp functionality",
            more::basic_node_port_udp,
        ),
        case(
            "[sig-network] Networking Granular Checks: Services should function for endpoint-Service: http",
            more::endpoint_to_service_tcp,
        ),
        case(
            "[sig-network] Networking Granular Checks: Services should function for endpoint-Service: udp",
            more::endpoint_to_service_udp,
        ),
        case(
            "[sig-network] Networking Granular Checks: Services should function for service endpoints using hostNetwork",
            svcs::host_network_endpoints,
        ),
        case(
            "[sig-network] Networking Granular Checks: Services should be able to handle large requests: udp",
            svcs::large_udp_requests,
        ),
        // Conntrack (conntrack.go).
        case(
            "[sig-network] Conntrack should be able to preserve UDP traffic when server pod cycles for a ClusterIP service",
            more::udp_cluster_ip_server_cycles_from_a_pod,
        ),
        case(
            "[sig-network] Conntrack should be able to preserve UDP traffic when server pod cycles for a ClusterIP service and client is hostNetwork",
            udp_endpoint_replaced,
        ),
        case(
            "[sig-network] Conntrack should be able to preserve UDP traffic when server pod cycles for a ClusterIP service with InternalTrafficPolicy set to Local",
            more::udp_cluster_ip_server_cycles_itp_local,
        ),
        case(
            "[sig-network] Conntrack should be able to preserve UDP traffic when initial unready endpoints get ready",
            more::udp_unready_endpoint_gets_ready,
        ),
        case(
            "[sig-network] Conntrack should be able to preserve UDP traffic when server pod cycles for a NodePort service",
            ct::udp_nodeport_server_cycles,
        ),
        case(
            "[sig-network] Conntrack should be able to cleanup conntrack entries when UDP service target port changes for a NodePort service",
            ct::udp_nodeport_target_port_changes,
        ),
        Case {
            name: "[sig-network] Conntrack should drop INVALID conntrack entries [Privileged]",
            run: ct::invalid_state_not_forwarded,
            not_applicable: &[("ebpf", NFT_ONLY_INVALID)],
        },
        Case {
            name: "[sig-network] Conntrack proxy implementation should not be vulnerable to the invalid conntrack state bug [Privileged]",
            run: ct::invalid_state_not_forwarded,
            not_applicable: &[("ebpf", NFT_ONLY_INVALID)],
        },
        // EndpointSlice (endpointslice.go).
        case(
            "[sig-network] EndpointSlice should support a Service with multiple ports specified in multiple EndpointSlices [Conformance]",
            more::slices_with_different_ports,
        ),
        case(
            "[sig-network] EndpointSlice should support a Service with multiple endpoint IPs specified in multiple EndpointSlices [Conformance]",
            more::slices_with_different_addresses,
        ),
        // KubeProxy (kube_proxy.go).
        case(
            "[sig-network] KubeProxy should set TCP CLOSE_WAIT timeout [Privileged]",
            ct::close_wait_timeout,
        ),
        Case {
            name: "[sig-network] KubeProxy should update metric for tracking accepted packets destined for localhost nodeports",
            run: ct::not_run,
            not_applicable: &[(
                "*",
                "checks kube-proxy's iptables route_localnet counter; neither datapath serves NodePorts on 127.0.0.1 (kube-proxy's nftables mode does not either)",
            )],
        },
        // LoadBalancers (loadbalancer.go).
        case(
            "[sig-network] LoadBalancers [Feature:LoadBalancer] should only allow access from service loadbalancer source ranges [Slow]",
            svcs::lb_source_ranges_pods_on_the_node,
        ),
    ]
}
