#!/usr/bin/env python3
"""Verify the Leasehold audit chain from the log alone, with a pinned key.

Written from schemas/audit-chain.md, independently of the Rust code, so
that an auditor need trust neither the platform nor its `lh` binary: it reads
the JetStream stream (LH_EVENTS) in order, recomputes every link, and checks
every `audit.checkpoint` event against the recomputed chain and the pinned
ed25519 key.

The stream holds messages, not links, so a changed, dropped or inserted
message shows up at the first signed checkpoint after it. That checkpoint's
`sequence` is the *first bad sequence*. Each checkpoint is checked in this
order; the first rule it breaks is its reason:

1. `malformed_checkpoint`: data lacks sequence/events (whole numbers),
   head (64 hex digits), public_key or signature (strings);
2. `key_not_pinned`: public_key is not the pinned key;
3. `bad_signature`: the signature does not verify over its statement;
4. `not_before_checkpoint`: sequence is not before the checkpoint message;
5. `out_of_window`: the checkpoint trails its sequence by more than
   MAX_CHECKPOINT_LAG_MESSAGES messages;
6. `events_mismatch`: events differs from the count at sequence (a dropped
   message: it leaves a gap in the stream's sequences);
7. `head_mismatch`: head differs from the link at sequence (a changed
   message).

The chain "at" sequence S is its state after the last message whose stream
sequence is at most S. Checkpoints that sign a sequence before the start of
a resumed run are not counted (the earlier run checked them).

Exit codes: 0 verified, 1 broken or unverifiable, 2 usage or I/O error.

Credentials as the platform's tools take them: LH_NATS_USER with
LH_NATS_NKEY_SEED_FILE (the deployment's read-only `auditor` user) or
LH_NATS_PASSWORD_FILE; TLS when LH_NATS_CA_FILE is set.
"""

import argparse
import asyncio
import hashlib
import json
import os
import re
import ssl
import struct
import sys

CHECKPOINT_TYPE = "audit.checkpoint"
MAX_CHECKPOINT_LAG_MESSAGES = 100_000
READ_STALL_TIMEOUT_SECS = 10
FETCH_BATCH_MESSAGES = 1000
MAX_AUDIT_FILE_BYTES = 64 * 1024
GENESIS = bytes(32)
HEX64 = re.compile(r"[0-9a-fA-F]{64}")
HEX128 = re.compile(r"[0-9a-fA-F]{128}")


class UsageError(Exception):
    """Bad arguments, configuration, or a log that cannot be read: exit 2."""


def link(prev: bytes, seq: int, subject: str, payload: bytes) -> bytes:
    s = subject.encode()
    return hashlib.sha256(
        prev
        + struct.pack(">Q", seq)
        + struct.pack(">I", len(s))
        + s
        + struct.pack(">Q", len(payload))
        + payload
    ).digest()


def statement(sequence: int, events: int, head: bytes) -> bytes:
    return f"leasehold-audit-checkpoint:v1:{sequence}:{events}:{head.hex()}".encode()


def signature_holds(public_key: bytes, signature_hex: str, sequence, events, head) -> bool:
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey

    if not isinstance(signature_hex, str) or not HEX128.fullmatch(signature_hex):
        return False
    try:
        VerifyKey(public_key).verify(
            statement(sequence, events, head), bytes.fromhex(signature_hex)
        )
        return True
    except (BadSignatureError, ValueError):
        return False


def _whole(value):
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64
    return value if ok else None


def _no_constants(name):
    raise ValueError(f"not JSON: {name}")


def checkpoint_claim(payload: bytes):
    """None: not a checkpoint. (None,): a malformed one. (claim,): its data."""
    if CHECKPOINT_TYPE.encode() not in payload:
        return None
    try:
        envelope = json.loads(payload.decode("utf-8"), parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(envelope, dict) or envelope.get("type") != CHECKPOINT_TYPE:
        return None
    data = envelope.get("data")
    if not isinstance(data, dict):
        return (None,)
    sequence, events = _whole(data.get("sequence")), _whole(data.get("events"))
    head, key, sig = data.get("head"), data.get("public_key"), data.get("signature")
    if (
        sequence is None
        or events is None
        or not isinstance(head, str)
        or not HEX64.fullmatch(head)
        or not isinstance(key, str)
        or not isinstance(sig, str)
    ):
        return (None,)
    return (
        {
            "sequence": sequence,
            "events": events,
            "head": bytes.fromhex(head),
            "public_key": key,
            "signature": sig,
        },
    )


class Check:
    """Feed it the stream's messages in order; `report()` says what it found."""

    def __init__(self, pinned: bytes, resume=None):
        self.pinned = pinned
        self.resumed_from = None
        seq, events, head = 0, 0, GENESIS
        if resume is not None:
            if not isinstance(resume.get("head"), str) or not HEX64.fullmatch(resume["head"]):
                raise UsageError("the resume head is not 64 hex digits")
            head = bytes.fromhex(resume["head"])
            seq, events = resume["sequence"], resume["events"]
            if not signature_holds(pinned, resume["signature"], seq, events, head):
                raise UsageError(
                    f"the checkpoint to resume from (sequence {seq}) is not signed by the pinned key"
                )
            self.resumed_from = {
                "sequence": seq,
                "events": events,
                "head": head.hex(),
                "signature": resume["signature"].lower(),
            }
        self.head, self.events, self.last = head, events, seq
        self.checked_from = seq + 1
        self.past = [(seq, events, head)]
        self.checkpoints = 0
        self.checkpoints_verified = 0
        self.first_bad = None
        self.first_gap = None
        self.last_checkpoint = self.resumed_from
        self.signed_events = events

    def message(self, seq: int, subject: str, payload: bytes):
        if seq <= self.last:
            return
        if seq > self.last + 1 and self.first_gap is None:
            self.first_gap = self.last + 1
        self.head = link(self.head, seq, subject, payload)
        self.events += 1
        self.last = seq
        self.past.append((seq, self.events, self.head))
        if len(self.past) > 2 * MAX_CHECKPOINT_LAG_MESSAGES:
            del self.past[: len(self.past) - MAX_CHECKPOINT_LAG_MESSAGES]
        claim = checkpoint_claim(payload)
        if claim is not None:
            self.checkpoint(seq, claim[0])

    def at(self, sequence):
        """The chain after the last message at or before `sequence`."""
        window = self.past[-MAX_CHECKPOINT_LAG_MESSAGES:]
        for past in reversed(window):
            if past[0] <= sequence:
                return past
        return None

    def checkpoint(self, at: int, claim):
        if claim is None:
            return self.breach(at, at, "malformed_checkpoint")
        if claim["sequence"] < self.checked_from:
            return
        self.checkpoints += 1
        key = claim["public_key"].strip()
        if not HEX64.fullmatch(key) or bytes.fromhex(key) != self.pinned:
            reason = "key_not_pinned"
        elif not signature_holds(
            self.pinned, claim["signature"], claim["sequence"], claim["events"], claim["head"]
        ):
            reason = "bad_signature"
        elif claim["sequence"] >= at:
            reason = "not_before_checkpoint"
        else:
            past = self.at(claim["sequence"])
            if past is None:
                reason = "out_of_window"
            elif past[1] != claim["events"]:
                reason = "events_mismatch"
            elif past[2] != claim["head"]:
                reason = "head_mismatch"
            else:
                reason = None
        if reason is not None:
            return self.breach(claim["sequence"], at, reason)
        self.checkpoints_verified += 1
        if self.first_bad is None:
            self.signed_events = claim["events"]
            self.last_checkpoint = {
                "sequence": claim["sequence"],
                "events": claim["events"],
                "head": claim["head"].hex(),
                "signature": claim["signature"].lower(),
            }

    def breach(self, sequence, checkpoint_at, reason):
        if self.first_bad is None:
            self.first_bad = {
                "sequence": sequence,
                "checkpoint_at": checkpoint_at,
                "reason": reason,
            }

    def report(self, problem=None):
        if (
            problem is None
            and self.first_bad is None
            and self.resumed_from is None
            and self.checkpoints_verified == 0
            and self.events > 0
        ):
            problem = (
                f"no checkpoint signed by the pinned key covers any of the "
                f"{self.events} events: nothing pins them"
            )
        return {
            "ok": self.first_bad is None and problem is None,
            "checked_from": self.checked_from,
            "sequence": self.last,
            "events": self.events,
            "head": self.head.hex(),
            "checkpoints": self.checkpoints,
            "checkpoints_verified": self.checkpoints_verified,
            "first_bad_sequence": self.first_bad["sequence"] if self.first_bad else None,
            "first_bad": self.first_bad,
            "first_gap": self.first_gap,
            "last_checkpoint": self.last_checkpoint,
            "resumed_from": self.resumed_from,
            "unsigned_events": self.events - self.signed_events,
            "problem": problem,
        }


def read_small_file(path, what):
    try:
        if os.path.getsize(path) > MAX_AUDIT_FILE_BYTES:
            raise UsageError(f"the {what} {path} is larger than {MAX_AUDIT_FILE_BYTES} bytes")
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise UsageError(f"cannot read the {what} {path}: {e}") from e


def pinned_key(args) -> bytes:
    text = args.public_key if args.public_key else read_small_file(args.public_key_file, "public key file")
    text = text.strip()
    if not HEX64.fullmatch(text):
        raise UsageError(f"--public-key: {text!r} is not an ed25519 public key (64 hex digits)")
    return bytes.fromhex(text)


def resume_point(value: str):
    """SEQUENCE:EVENTS:HEAD:SIGNATURE, or a state file (or a report) as JSON."""
    parts = value.strip().split(":")
    if len(parts) == 4:
        try:
            return {
                "sequence": int(parts[0]),
                "events": int(parts[1]),
                "head": parts[2].lower(),
                "signature": parts[3].lower(),
            }
        except ValueError as e:
            raise UsageError(f"--resume-from: {value!r}: {e}") from e
    try:
        state = json.loads(read_small_file(value, "state file"))
    except ValueError as e:
        raise UsageError(f"--resume-from {value}: not JSON: {e}") from e
    if isinstance(state, dict) and "last_checkpoint" in state:
        state = state["last_checkpoint"]
    fields = ("sequence", "events", "head", "signature")
    if not isinstance(state, dict) or any(f not in state for f in fields):
        raise UsageError(f"--resume-from {value}: no checkpoint ({', '.join(fields)})")
    if _whole(state["sequence"]) is None or _whole(state["events"]) is None:
        raise UsageError(f"--resume-from {value}: sequence and events are whole numbers")
    return state


def connect_options():
    """The same environment the platform's tools read."""
    env = lambda name: os.environ.get(name) or None  # noqa: E731
    user = env("LH_NATS_USER")
    seed_file, password_file = env("LH_NATS_NKEY_SEED_FILE"), env("LH_NATS_PASSWORD_FILE")
    options = {}
    if seed_file and password_file:
        raise UsageError("LH_NATS_NKEY_SEED_FILE and LH_NATS_PASSWORD_FILE are both set; name one")
    if (seed_file or password_file) and not user:
        raise UsageError("LH_NATS_USER is not set; it names the user whose secret is given")
    if seed_file:
        options["nkeys_seed"] = seed_file
    if password_file:
        options["user"] = user
        options["password"] = read_small_file(password_file, "password file").strip()
    if user:
        # The server lets each user read replies on its own inbox prefix only.
        options["inbox_prefix"] = f"_INBOX_{user}".encode()
    ca = env("LH_NATS_CA_FILE")
    if ca:
        context = ssl.create_default_context(cafile=ca)
        cert, key = env("LH_NATS_CLIENT_CERT_FILE"), env("LH_NATS_CLIENT_KEY_FILE")
        if cert and key:
            context.load_cert_chain(cert, key)
        options["tls"] = context
    return options


async def verify(args, check: Check):
    import nats
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    servers = [s.strip() for s in args.nats_url.split(",")]
    try:
        nc = await nats.connect(
            servers,
            name="audit-verify.py",
            connect_timeout=5,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            **connect_options(),
        )
    except Exception as e:  # noqa: BLE001 - any failure to connect is an I/O error
        raise UsageError(f"could not reach NATS at {args.nats_url}: {e!r}") from e
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(args.stream)
        except Exception as e:  # noqa: BLE001
            raise UsageError(f"stream {args.stream}: {e!r}") from e
        first, last, count = info.state.first_seq, info.state.last_seq, info.state.messages
        start = check.checked_from
        if count > 0 and first > start:
            return check.report(
                f"the log starts at sequence {first}: the messages from {start} have expired; "
                f"resume from a checkpoint this key signed at sequence {first - 1} or later "
                f"(--resume-from)"
            )
        if count == 0 or last < start:
            return check.report()
        name = nc._nuid.next().decode()  # an ephemeral consumer's name
        config = ConsumerConfig(
            name=name,
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.ALL if start <= 1 else DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=None if start <= 1 else start,
            inactive_threshold=60.0,
            mem_storage=True,
        )
        try:
            await js._jsm.add_consumer(args.stream, config=config)
            sub = await js.pull_subscribe_bind(consumer=name, stream=args.stream)
        except Exception as e:  # noqa: BLE001
            raise UsageError(f"reading {args.stream}: {e!r}") from e
        shown = sys.stderr.isatty()
        while check.last < last:
            try:
                batch = await sub.fetch(FETCH_BATCH_MESSAGES, timeout=READ_STALL_TIMEOUT_SECS)
            except NatsTimeout as e:
                raise UsageError(
                    f"{args.stream} sent nothing for {READ_STALL_TIMEOUT_SECS} s after "
                    f"sequence {check.last}"
                ) from e
            for msg in batch:
                seq = msg.metadata.sequence.stream
                if seq > last:
                    break
                check.message(seq, msg.subject, msg.data)
            if shown:
                total = max(last - start + 1, 1)
                done = min(check.last - start + 1, total)
                print(f"\r{done}/{total} messages ({done * 100 // total}%)", end="", file=sys.stderr)
        if shown:
            print(file=sys.stderr)
        return check.report()
    finally:
        await nc.close()


def render(report) -> str:
    lines = []
    for key, value in report.items():
        if key == "ok":
            value = "yes" if value else "NO"
        elif isinstance(value, (dict, list)):
            value = json.dumps(value)
        elif value is None:
            value = "-"
        lines.append(f"{key:<22} {value}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nats-url", default=os.environ.get("LH_NATS_URL"), metavar="URL")
    key = parser.add_mutually_exclusive_group(required=True)
    key.add_argument("--public-key", metavar="HEX")
    key.add_argument("--public-key-file", metavar="PATH")
    parser.add_argument("--stream", default="LH_EVENTS", metavar="NAME")
    parser.add_argument("--resume-from", metavar="TOKEN|PATH")
    parser.add_argument("--save-state", metavar="PATH")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        if not args.nats_url:
            raise UsageError("--nats-url URL (or LH_NATS_URL) names the server to read the log from")
        pinned = pinned_key(args)
        resume = resume_point(args.resume_from) if args.resume_from else None
        report = asyncio.run(verify(args, Check(pinned, resume)))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report), end="")
    if not report["ok"]:
        why = report["problem"]
        if report["first_bad"]:
            bad = report["first_bad"]
            why = (
                f"the checkpoint at stream sequence {bad['checkpoint_at']} signing sequence "
                f"{bad['sequence']} fails: {bad['reason']}"
            )
        print(f"error: audit chain verification failed: {why}", file=sys.stderr)
        return 1
    if args.save_state and report["last_checkpoint"]:
        with open(args.save_state, "w", encoding="utf-8") as f:
            f.write(json.dumps(report["last_checkpoint"], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
