// Reply targets sealed by the gateways: where a reply goes, kept without a raw id.
// The same envelope as the Python gateway's (clients/python/switchboard_client/
// reply_targets.py), so that either gateway opens what the other sealed:
//
//   byte 0       1 (the envelope version)
//   bytes 1-12   a random nonce
//   bytes 13-    AES-256-GCM ciphertext of the target, then its 16-byte tag,
//                with the associated data "switchboard reply target v1"
//
// The plaintext is the JSON object {"platform", "chat_id", "thread_id"}, padded
// with spaces to a multiple of 128 bytes. The key: 32 random bytes, as 64 hex
// characters or base64 (`openssl rand -hex 32`), from the gateway's `replyKey`
// option or SWITCHBOARD_REPLY_KEY; the same for every gateway of a deployment.

import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';

/** The environment variable a gateway reads its reply key from. */
export const REPLY_KEY_ENV = 'SWITCHBOARD_REPLY_KEY';
const KEY_BYTES = 32;
const VERSION = 1;
const NONCE_BYTES = 12;
const TAG_BYTES = 16;
/** What the services accept (a sealed target of at most 1 KiB). */
export const MAX_SEALED_BYTES = 1024;
const ASSOCIATED_DATA = Buffer.from('switchboard reply target v1');
const PADDING = 128;
const MAX_PLAINTEXT = MAX_SEALED_BYTES - 1 - NONCE_BYTES - TAG_BYTES;
// 32 random bytes take about 31 values; fewer than 16 is a placeholder or a pattern.
const MIN_DISTINCT_BYTES = 16;

/** The reply key cannot be used; the message says what to give instead. */
export class ReplyKeyRefused extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'ReplyKeyRefused';
  }
}

/** A sealed target this gateway cannot open (another key, altered, not a target). */
export class TargetUnreadable extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'TargetUnreadable';
  }
}

/**
 * @typedef {object} ReplyTarget Where a reply goes on its platform.
 * @property {string} platform
 * @property {string} chatId
 * @property {string} threadId "" for none.
 */

/**
 * The 32-byte key from its text (hex or base64) or its raw bytes.
 * @param {string | Uint8Array} value
 * @returns {Buffer}
 */
export function parseReplyKey(value) {
  let key;
  if (typeof value !== 'string' && value.length === KEY_BYTES) {
    key = Buffer.from(value);
  } else {
    const text = (typeof value === 'string' ? value : Buffer.from(value).toString('latin1')).trim();
    if (/^[0-9a-fA-F]{64}$/.test(text)) key = Buffer.from(text, 'hex');
    else if (/^[A-Za-z0-9+/_-]+={0,2}$/.test(text)) key = Buffer.from(text.replace(/-/g, '+').replace(/_/g, '/'), 'base64');
    if (!key || key.length !== KEY_BYTES) {
      throw new ReplyKeyRefused(
        `the reply key must be ${KEY_BYTES} random bytes, given as 64 hex characters or base64 ` +
          `(e.g. \`openssl rand -hex 32\`); this one is ${text.length} characters that are neither ` +
          '(a placeholder, or a key too short)',
      );
    }
  }
  if (new Set(key).size < MIN_DISTINCT_BYTES) {
    throw new ReplyKeyRefused(
      'the reply key is not random (a placeholder, or a few byte values repeated): give 32 random ' +
        'bytes, e.g. `openssl rand -hex 32`',
    );
  }
  return key;
}

/** Seals and opens reply targets with one gateway key. */
export class ReplySealer {
  /** @param {string | Uint8Array} key */
  constructor(key) {
    this._key = parseReplyKey(key);
  }

  /**
   * The envelope of `target`; throws when its ids are too long to fit 1 KiB.
   * @param {ReplyTarget} target
   * @returns {Buffer}
   */
  seal(target) {
    const fields = { platform: target.platform, chat_id: target.chatId, thread_id: target.threadId ?? '' };
    const plain = Buffer.from(JSON.stringify(fields));
    if (plain.length > MAX_PLAINTEXT) {
      throw new Error(`the reply target takes ${plain.length} bytes; at most ${MAX_PLAINTEXT} can be sealed`);
    }
    const padded = Buffer.alloc(Math.min(Math.ceil(plain.length / PADDING) * PADDING, MAX_PLAINTEXT), ' ');
    plain.copy(padded);
    const nonce = randomBytes(NONCE_BYTES);
    const cipher = createCipheriv('aes-256-gcm', this._key, nonce);
    cipher.setAAD(ASSOCIATED_DATA);
    const body = Buffer.concat([cipher.update(padded), cipher.final()]);
    return Buffer.concat([Buffer.from([VERSION]), nonce, body, cipher.getAuthTag()]);
  }

  /**
   * The target sealed in `sealed`; throws TargetUnreadable when this key cannot open it.
   * @param {Uint8Array} sealed
   * @returns {ReplyTarget}
   */
  open(sealed) {
    const envelope = Buffer.from(sealed);
    if (envelope.length < 1 + NONCE_BYTES + TAG_BYTES + 1 || envelope[0] !== VERSION) {
      throw new TargetUnreadable('not a sealed reply target of envelope version 1');
    }
    const nonce = envelope.subarray(1, 1 + NONCE_BYTES);
    const tag = envelope.subarray(envelope.length - TAG_BYTES);
    const decipher = createDecipheriv('aes-256-gcm', this._key, nonce);
    decipher.setAAD(ASSOCIATED_DATA);
    decipher.setAuthTag(tag);
    let plain;
    try {
      plain = Buffer.concat([decipher.update(envelope.subarray(1 + NONCE_BYTES, envelope.length - TAG_BYTES)), decipher.final()]);
    } catch {
      throw new TargetUnreadable(
        "the sealed reply target does not open with this gateway's reply key (sealed with another key, or altered)",
      );
    }
    let fields;
    try {
      fields = JSON.parse(plain.toString('utf8'));
    } catch {
      fields = null;
    }
    const parts = fields ? [fields.platform, fields.chat_id, fields.thread_id] : [];
    if (parts.length !== 3 || !parts.every((part) => typeof part === 'string') || !parts[0] || !parts[1]) {
      throw new TargetUnreadable('the sealed reply target opened to no platform and chat');
    }
    return { platform: parts[0], chatId: parts[1], threadId: parts[2] };
  }
}

/**
 * A gateway's sealer: from its `replyKey` option, else SWITCHBOARD_REPLY_KEY; null
 * when neither is set (the gateway then records reply targets in clear).
 * @param {string | Uint8Array | null | undefined} key
 * @param {Record<string, string | undefined>} [env]
 * @returns {ReplySealer | null}
 */
export function replySealer(key, env = process.env) {
  const given = key ?? (env[REPLY_KEY_ENV] || null);
  return given === null ? null : new ReplySealer(given);
}
