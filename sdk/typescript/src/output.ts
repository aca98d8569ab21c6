// Live output: bytes per stream, decoded as text without ever splitting a
// UTF-8 sequence (a streaming TextDecoder per stream holds an incomplete
// sequence back until its next bytes arrive).

import type { OutputChunk } from "./types.js";

/** Decodes the chunks of the two streams of one command. */
export class ChunkDecoder {
  private readonly decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };

  chunk(stream: "stdout" | "stderr", data: Uint8Array, offset?: number): OutputChunk {
    const text = this.decoders[stream].decode(data, { stream: true });
    return offset === undefined ? { stream, data, text } : { stream, data, text, offset };
  }

  /** The text held back at the end of each stream (an incomplete sequence, as U+FFFD). */
  flush(): { stdout: string; stderr: string } {
    return { stdout: this.decoders.stdout.decode(), stderr: this.decoders.stderr.decode() };
  }
}

export function concat(parts: Uint8Array[]): Uint8Array {
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

export const utf8 = new TextDecoder();
export const encoder = new TextEncoder();

/** The bytes of a string (UTF-8) or the bytes themselves. */
export function bytesOf(d: string | Uint8Array): Uint8Array {
  return typeof d === "string" ? encoder.encode(d) : d;
}
