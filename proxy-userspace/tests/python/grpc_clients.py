"""The daemon's gRPC APIs as a Python user calls them: grpcio with default
channel options (so, since grpcio 1.57, the percent-encoded socket path as
:authority), stubs generated from the repository's .proto files by
grpcio-tools, and the stock reflection and health clients.

Usage: grpc_clients.py STUBS_DIR PROTO_ROOT COMMAND TARGET [ARGS...]
Prints one JSON document on stdout; gRPC errors print {"error": CODE}.
"""

import json
import os
import sys

import grpc
from grpc_tools import protoc


def generate_stubs(out, proto_root):
    sys.path.insert(0, out)
    if os.path.exists(os.path.join(out, "podinfo", "v1alpha1", "podinfo_pb2_grpc.py")):
        return
    os.makedirs(out, exist_ok=True)
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    for proto in ("localnet/v1/localnet.proto", "podinfo/v1alpha1/podinfo.proto"):
        rc = protoc.main(["protoc", f"-I{proto_root}", f"-I{include}",
                          f"--python_out={out}", f"--grpc_python_out={out}", proto])
        if rc != 0:
            sys.exit(f"protoc failed on {proto}")


def localnet(target):
    from localnet.v1 import localnet_pb2 as pb, localnet_pb2_grpc as rpc
    with grpc.insecure_channel(target) as ch:
        stub = rpc.EndpointsStub(ch)
        items = list(stub.Next(pb.NextFilter(), timeout=10))
        first = items[0].next
        names = [f"{i.endpoints.service.namespace}/{i.endpoints.service.name}" for i in items[1:]]
        watch = stub.Watch(pb.WatchRequest(), timeout=10)
        begin = next(watch).begin
        watched = []
        for ev in watch:
            if ev.WhichOneof("event") == "end":
                break
            watched.append(f"{ev.service.service.namespace}/{ev.service.service.name}")
        watch.cancel()
        return {"next_rev": first.rev, "next_services": names,
                "watch_rev": begin.rev, "watch_count": begin.service_count,
                "watch_services": watched}


def localnet_deltas(target, *want):
    """A delta Watch: prints {"ready": REV} after the first (full) frame,
    then applies frames until the services are exactly `want`, each
    "namespace/name=IP" with IP among its endpoints; returns the frames'
    heads and the rebuilt state."""
    from localnet.v1 import localnet_pb2 as pb, localnet_pb2_grpc as rpc
    with grpc.insecure_channel(target) as ch:
        stub = rpc.EndpointsStub(ch)
        watch = stub.Watch(pb.WatchRequest(deltas=True), timeout=30)
        want = dict(w.split("=") for w in want)
        state, frames = {}, []

        def done():
            return sorted(state) == sorted(want) and all(
                ip in [e.ip for e in state[k].endpoints] for k, ip in want.items())
        while not frames or not done():
            begin = next(watch).begin
            if begin.base_rev == 0:
                state = {}
            elif not frames or begin.base_rev != frames[-1]["rev"]:
                raise SystemExit(f"a delta on {begin.base_rev} after {frames}")
            for ev in watch:
                kind = ev.WhichOneof("event")
                if kind == "end":
                    break
                if kind == "service":
                    svc = ev.service.service
                    state[f"{svc.namespace}/{svc.name}"] = ev.service
                elif kind == "removed":
                    del state[f"{ev.removed.namespace}/{ev.removed.name}"]
            frames.append({"rev": begin.rev, "base_rev": begin.base_rev,
                           "services": begin.service_count, "removed": begin.removed_count})
            if len(frames) == 1:
                print(json.dumps({"ready": begin.rev}), flush=True)
        watch.cancel()
        return {"frames": frames,
                "state": {k: [e.ip for e in v.endpoints] for k, v in sorted(state.items())}}


def podinfo(target, namespace, name):
    from podinfo.v1alpha1 import podinfo_pb2 as pb, podinfo_pb2_grpc as rpc
    with grpc.insecure_channel(target) as ch:
        stub = rpc.PodInfoServiceStub(ch)
        listed = stub.ListPodConditions(pb.ListPodConditionsRequest(), timeout=10)
        got = stub.GetPodConditions(
            pb.GetPodConditionsRequest(pod_namespace=namespace, pod_name=name), timeout=10)
        watch = stub.WatchPodConditions(pb.WatchPodConditionsRequest(), timeout=10)
        first = next(watch)
        watch.cancel()
        return {"list": sorted(f"{p.pod_namespace}/{p.pod_name}" for p in listed.pods),
                "get": f"{got.pod.pod_namespace}/{got.pod.pod_name}",
                "get_conditions": [c.type for c in got.pod.conditions],
                "watch": sorted(f"{p.pod_namespace}/{p.pod_name}" for p in first.pods)}


def reflection(target, symbol):
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase)
    with grpc.insecure_channel(target) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        services = sorted(db.get_services())
        pool = DescriptorPool(db)
        message = pool.FindMessageTypeByName(symbol)
        # The comments travel as source_code_info of the file descriptor.
        proto = db.FindFileContainingSymbol(symbol)
        comments = [loc.leading_comments.strip() for loc in proto.source_code_info.location
                    if loc.leading_comments.strip()]
        return {"services": services, "message": message.full_name,
                "fields": [f.name for f in message.fields], "comments": len(comments)}


def health(target, *services):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    out = {}
    with grpc.insecure_channel(target) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for s in services:
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(service=s), timeout=10)
                out[s] = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
            except grpc.RpcError as e:
                out[s] = e.code().name
    return out


def main():
    stubs, proto_root, command, target, *args = sys.argv[1:]
    generate_stubs(stubs, proto_root)
    commands = {"localnet": localnet, "localnet-deltas": localnet_deltas, "podinfo": podinfo,
                "reflection": reflection, "health": health}
    try:
        result = commands[command](target, *args)
    except grpc.RpcError as e:
        result = {"error": e.code().name, "details": e.details()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
