"""gRPC reflection serves our protos with their comments, so `grpcurl describe` shows the API documentation; the
health and reflection services stay describable."""

from __future__ import annotations

from google.protobuf import descriptor_pb2
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from mascot.api.conversation.v1 import conversation_pb2_grpc
from mascot.core.metrics import Metrics
from mascot.core.server import build_server, channel

SERVICE = "mascot.api.conversation.v1.ConversationService"


async def _file_of(stub, symbol: str) -> descriptor_pb2.FileDescriptorProto:
    async def requests():
        yield reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)

    (resp,) = [r async for r in stub.ServerReflectionInfo(requests())]
    assert resp.WhichOneof("message_response") == "file_descriptor_response", resp
    files = [descriptor_pb2.FileDescriptorProto.FromString(b)
             for b in resp.file_descriptor_response.file_descriptor_proto]
    return next(f for f in files if any(s.name == symbol.rsplit(".", 1)[-1] for s in f.service)
                or symbol.rsplit(".", 1)[-1] in {m.name for m in f.message_type})


async def test_reflection_carries_the_proto_comments():
    srv = await build_server("gateway", Metrics(), [(conversation_pb2_grpc.add_ConversationServiceServicer_to_server,
                                                     conversation_pb2_grpc.ConversationServiceServicer(), SERVICE)])
    ch = channel(f"127.0.0.1:{srv.port}")
    try:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        f = await _file_of(stub, SERVICE)
        comments = " ".join(loc.leading_comments for loc in f.source_code_info.location)
        assert "ListPersonas lists the persona cards a conversation can use" in comments
        assert "SendMessageRequest" in {m.name for m in f.message_type}
        h = await _file_of(stub, health.SERVICE_NAME)  # other services are still described (without comments)
        assert h.package == "grpc.health.v1"
    finally:
        await ch.close()
        await srv.stop(0)
