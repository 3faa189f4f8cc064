// @switchboard/client: Node.js clients for Switchboard's SessionService and
// DeliveryService, built on @grpc/grpc-js with the protos loaded at run time,
// and a reference gateway on the same contract as the Python one.

export { DEFAULT_DEADLINE_MS } from './base.js';
export { DeliveryClient } from './delivery.js';
export { SwitchboardError, codeName, toSwitchboardError } from './errors.js';
export { Gateway, PlatformAdapter, RECOVERED_MARKER, SendFailed } from './gateway.js';
export { MAX_ROUTING_KEY_LEN, NON_CHAT_TRANSPORTS, escaped, routingKey } from './keys.js';
export { DEFAULT_PROTO_DIR, LOADER_OPTIONS, loadDefinitions, resolveProtoDir } from './protos.js';
export { REPLY_KEY_ENV, ReplyKeyRefused, ReplySealer, TargetUnreadable, parseReplyKey } from './reply-targets.js';
export { SessionClient } from './session.js';
