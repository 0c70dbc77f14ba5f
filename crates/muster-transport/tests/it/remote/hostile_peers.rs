//! A raw tonic client that sends exactly the bytes a broken or hostile peer would: malformed,
//! oversized and unknown envelopes, and a broken one amid a frame, answered with errors while
//! the link goes on.

use super::*;

#[tokio::test]
async fn malformed_oversized_and_unknown_kind_envelopes_get_errors_and_the_link_goes_on()
-> anyhow::Result<()> {
    let system = System::new();
    let mut config = config();
    config.max_message_size = 1024 * 1024;
    let (b, _seqs) = pong_node(&system, config).await?;
    let (frames, mut inbound) = raw_link(&b).await?;

    // Field 1 declared as a varint but truncated: not a Ping.
    let garbage = vec![0x08, 0xff, 0xff];
    let oversized = Ping {
        seq: 1,
        payload: vec![1; 2 * 1024 * 1024],
    }
    .encode_to_vec();
    let valid = Ping {
        seq: 9,
        payload: vec![],
    }
    .encode_to_vec();
    let mut unknown_kind = ask_envelope(4, "pong", "muster.test.Ping", valid.clone());
    unknown_kind.kind = 99;
    let mut not_utf8 = ask_envelope(5, "pong", "muster.test.Ping", valid.clone());
    not_utf8.to = Bytes::from_static(&[0xff, 0xfe]);
    frames
        .send(Frame {
            hello: None,
            envelopes: vec![
                ask_envelope(1, "pong", "muster.test.Ping", garbage),
                ask_envelope(2, "pong", "muster.test.Ping", oversized),
                unknown_kind,
                not_utf8,
                ask_envelope(3, "pong", "muster.test.Ping", valid),
            ],
        })
        .await?;

    let mut answers = answers(&mut inbound, &[1, 2, 3, 4, 5]).await?;
    let mut answer = |id| answers.remove(&id).context("answered twice?");
    let malformed = answer(1)?;
    assert_eq!(malformed.kind, Kind::Error as i32);
    assert_eq!(malformed.error_code, ErrorCode::Malformed as i32);
    assert!(
        malformed.error.contains("muster.test.Ping"),
        "{}",
        malformed.error
    );

    let too_big = answer(2)?;
    assert_eq!(too_big.error_code, ErrorCode::Oversized as i32);

    let unknown = answer(4)?;
    assert_eq!(unknown.error_code, ErrorCode::Malformed as i32);
    assert!(unknown.error.contains("kind 99"), "{}", unknown.error);

    let bad_name = answer(5)?;
    assert_eq!(bad_name.error_code, ErrorCode::Malformed as i32);

    let reply = answer(3)?;
    assert_eq!(reply.kind, Kind::Reply as i32);
    assert_eq!(Pong::decode(reply.body)?.seq, 10);

    let stats = b.stats();
    assert_eq!((stats.malformed, stats.oversized), (3, 1));
    Ok(())
}

/// Frames written as raw bytes (so a test can send what no encoder would), answers read as
/// `Frame`s.
#[derive(Clone, Copy, Default)]
struct RawFrames;

impl tonic::codec::Codec for RawFrames {
    type Encode = Vec<u8>;
    type Decode = Frame;
    type Encoder = RawFrames;
    type Decoder = RawFrames;

    fn encoder(&mut self) -> RawFrames {
        RawFrames
    }

    fn decoder(&mut self) -> RawFrames {
        RawFrames
    }
}

impl tonic::codec::Encoder for RawFrames {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawFrames {
    type Item = Frame;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Frame>, tonic::Status> {
        Frame::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

/// An envelope as one element of a frame's `envelopes` (field 2): key, length, bytes.
fn element(envelope: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0x12];
    prost::encode_length_delimiter(envelope.len(), &mut bytes).expect("a Vec grows");
    bytes.extend_from_slice(envelope);
    bytes
}

#[tokio::test]
async fn a_broken_envelope_is_refused_by_id_and_the_rest_of_its_frame_delivered()
-> anyhow::Result<()> {
    let system = System::new();
    let (b, _seqs) = pong_node(&system, config()).await?;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", b.address()))?;
    let (channel, _) = member()
        .channel(endpoint, &[Role::Master, Role::Agent])
        .await?;
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await?;
    let (frames, rx) = mpsc::channel::<Vec<u8>>(16);
    frames
        .send(
            Frame {
                hello: Some(Hello {
                    node: "127.0.0.1:1".into(),
                    reads_same_head: false,
                    ..Hello::default()
                }),
                envelopes: vec![],
            }
            .encode_to_vec(),
        )
        .await?;
    let mut inbound = client
        .streaming(
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
            tonic::codegen::http::uri::PathAndQuery::from_static(
                "/muster.transport.v1.Transport/Link",
            ),
            RawFrames,
        )
        .await?
        .into_inner();
    let ask = |id: u64| {
        let body = Ping {
            seq: id,
            payload: vec![],
        }
        .encode_to_vec();
        element(&ask_envelope(id, "pong", "muster.test.Ping", body).encode_to_vec())
    };

    // Ask 1; then an envelope with request id 7 whose `to` claims 50 bytes it does not have;
    // then ask 3, in the same frame.
    let mut frame = ask(1);
    frame.extend(element(&[0x28, 7, 0x12, 50]));
    frame.extend(ask(3));
    frames.send(frame).await?;
    let mut first = answers(&mut inbound, &[1, 7, 3]).await?;
    assert_eq!(first[&1].kind, Kind::Reply as i32);
    assert_eq!(first[&3].kind, Kind::Reply as i32);
    let refused = first.remove(&7).context("request 7 answered")?;
    assert_eq!(refused.kind, Kind::Error as i32);
    assert_eq!(refused.error_code, ErrorCode::Malformed as i32);
    assert_eq!(b.stats().malformed, 1);

    // A frame whose last element runs past its end: what came before it is delivered, and
    // the link carries the next frame.
    let mut frame = ask(4);
    frame.extend([0x12, 100, 1, 2]);
    frames.send(frame).await?;
    assert_eq!(
        answers(&mut inbound, &[4]).await?[&4].kind,
        Kind::Reply as i32
    );
    frames.send(ask(5)).await?;
    assert_eq!(
        answers(&mut inbound, &[5]).await?[&5].kind,
        Kind::Reply as i32
    );
    assert_eq!(b.stats().malformed, 2);
    assert_eq!(b.stats().reconnects, 0);
    Ok(())
}
