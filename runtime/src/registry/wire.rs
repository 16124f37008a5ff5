//! The Confluent wire format: byte 0 is the magic byte `0`, bytes 1-4 the schema id (big-endian
//! u32), then the payload. Protobuf payloads start with the message indexes: the path of the
//! message in its `.proto` file (index among the file's top-level messages, then among that
//! message's nested ones), as a count and the indexes, each a zig-zag varint (Java's
//! `ByteUtils.writeVarint`); the common path `[0]` (the file's first message) is written as the
//! single byte `0` (a count of zero).

use super::RegistryError;

/// The magic byte that starts every record in the format.
pub const MAGIC: u8 = 0;
/// Length of the header: magic byte and schema id.
pub const HEADER_LEN: usize = 5;

/// `bytes` with the header of schema `id` in front of `payload`'s bytes.
pub fn encode(id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.push(MAGIC);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The schema id and the payload of `bytes`.
pub fn decode(bytes: &[u8]) -> Result<(u32, &[u8]), RegistryError> {
    if bytes.len() < HEADER_LEN {
        return Err(RegistryError::Wire(format!(
            "{} bytes, shorter than the 5-byte header",
            bytes.len()
        )));
    }
    if bytes[0] != MAGIC {
        return Err(RegistryError::Wire(format!(
            "first byte {:#04x}, expected the magic byte 0x00",
            bytes[0]
        )));
    }
    let id = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    Ok((id, &bytes[HEADER_LEN..]))
}

/// Appends the Protobuf message indexes `indexes` to `out`.
pub fn write_message_indexes(indexes: &[i32], out: &mut Vec<u8>) {
    if indexes == [0] {
        out.push(0);
        return;
    }
    write_zigzag(indexes.len() as i64, out);
    for &i in indexes {
        write_zigzag(i64::from(i), out);
    }
}

/// Reads the Protobuf message indexes at the start of `payload`; returns them and the rest.
pub fn read_message_indexes(payload: &[u8]) -> Result<(Vec<i32>, &[u8]), RegistryError> {
    let (count, mut rest) = read_zigzag(payload)?;
    if count == 0 {
        return Ok((vec![0], rest));
    }
    if count < 0 || count as usize > rest.len() {
        return Err(RegistryError::Wire(format!(
            "message index count {count} with {} bytes left",
            rest.len()
        )));
    }
    let mut indexes = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let (i, r) = read_zigzag(rest)?;
        let i = i32::try_from(i)
            .map_err(|_| RegistryError::Wire(format!("message index {i} out of range")))?;
        indexes.push(i);
        rest = r;
    }
    Ok((indexes, rest))
}

fn write_zigzag(v: i64, out: &mut Vec<u8>) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn read_zigzag(bytes: &[u8]) -> Result<(i64, &[u8]), RegistryError> {
    let mut z: u64 = 0;
    for (n, &b) in bytes.iter().enumerate().take(10) {
        z |= u64::from(b & 0x7f) << (7 * n);
        if b & 0x80 == 0 {
            let v = ((z >> 1) as i64) ^ -((z & 1) as i64);
            return Ok((v, &bytes[n + 1..]));
        }
    }
    Err(RegistryError::Wire(
        "truncated or over-long varint in the message indexes".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_is_magic_then_big_endian_id() {
        assert_eq!(encode(0x0102_0304, b"xy"), [0, 1, 2, 3, 4, b'x', b'y']);
        assert_eq!(decode(&[0, 0, 0, 1, 0, 7]).unwrap(), (256, &[7u8][..]));
    }

    #[test]
    fn bad_headers_are_named() {
        let short = decode(&[0, 1]).unwrap_err().to_string();
        assert!(short.contains("shorter than the 5-byte header"), "{short}");
        let magic = decode(b"{\"a\":1}").unwrap_err().to_string();
        assert!(magic.contains("magic byte"), "{magic}");
        assert!(
            magic.contains("without a schema registry serializer"),
            "{magic}"
        );
    }

    #[test]
    fn message_indexes_as_confluent_writes_them() {
        let mut out = Vec::new();
        write_message_indexes(&[0], &mut out);
        assert_eq!(out, [0], "the first message is a single 0");
        out.clear();
        // [1]: count 1 -> zigzag 2, index 1 -> zigzag 2.
        write_message_indexes(&[1], &mut out);
        assert_eq!(out, [2, 2]);
        out.clear();
        // [2, 0, 70]: count 3 -> 6; 2 -> 4; 0 -> 0; 70 -> 140 = 0x8c 0x01.
        write_message_indexes(&[2, 0, 70], &mut out);
        assert_eq!(out, [6, 4, 0, 0x8c, 0x01]);
        assert_eq!(
            read_message_indexes(&[6, 4, 0, 0x8c, 0x01, 9]).unwrap(),
            (vec![2, 0, 70], &[9u8][..])
        );
        assert_eq!(
            read_message_indexes(&[0, 9]).unwrap(),
            (vec![0], &[9u8][..])
        );
        assert!(read_message_indexes(&[0x80]).is_err(), "truncated");
        assert!(
            read_message_indexes(&[40, 0]).is_err(),
            "count past the end"
        );
    }

    proptest! {
        #[test]
        fn header_round_trips(id: u32, payload: Vec<u8>) {
            let bytes = encode(id, &payload);
            prop_assert_eq!(bytes.len(), payload.len() + HEADER_LEN);
            let (got, rest) = decode(&bytes).unwrap();
            prop_assert_eq!(got, id);
            prop_assert_eq!(rest, &payload[..]);
        }

        #[test]
        fn message_indexes_round_trip(
            indexes in proptest::collection::vec(0i32..i32::MAX, 1..6),
            payload: Vec<u8>,
        ) {
            let mut bytes = Vec::new();
            write_message_indexes(&indexes, &mut bytes);
            bytes.extend_from_slice(&payload);
            let (got, rest) = read_message_indexes(&bytes).unwrap();
            prop_assert_eq!(got, indexes);
            prop_assert_eq!(rest, &payload[..]);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes: Vec<u8>) {
            let _ = decode(&bytes);
            let _ = read_message_indexes(&bytes);
        }
    }
}
