//! A second floor for the face benchmark: the same work as
//! `floor_forwarder` (body read whole, the top-level `model` picked out,
//! one upstream, the answer passed back) with HTTP/1.1 framed by hand on
//! `httparse` instead of hyper's connection machinery: one task per client
//! connection that also owns its upstream connection while a request is in
//! flight, thread per core. Only Content-Length bodies (requests and
//! answers): a measurement of what hyper costs, not a product.
//!
//! Usage: `raw_forwarder LISTEN_ADDR UPSTREAM_ADDR [WORKERS]`

use std::cell::RefCell;
use std::net::SocketAddr;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[path = "support/workers.rs"]
mod workers;

const MAX_HEADERS: usize = 64;

#[derive(serde::Deserialize)]
struct ModelOnly<'a> {
    #[serde(borrow)]
    model: std::borrow::Cow<'a, str>,
}

thread_local! {
    static POOL: RefCell<Vec<Upstream>> = const { RefCell::new(Vec::new()) };
}

struct Upstream {
    tcp: TcpStream,
    buf: BytesMut,
}

/// Reads until `buf` holds a whole head; returns its length and the body
/// length it declares.
async fn read_head(
    tcp: &mut TcpStream,
    buf: &mut BytesMut,
    request: bool,
) -> std::io::Result<Option<(usize, usize, bool)>> {
    loop {
        if !buf.is_empty() {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let (status, hs) = if request {
                let mut r = httparse::Request::new(&mut headers);
                let s = r.parse(buf).map_err(std::io::Error::other)?;
                (
                    s,
                    r.headers
                        .iter()
                        .map(|h| (h.name, h.value))
                        .collect::<Vec<_>>(),
                )
            } else {
                let mut r = httparse::Response::new(&mut headers);
                let s = r.parse(buf).map_err(std::io::Error::other)?;
                (
                    s,
                    r.headers
                        .iter()
                        .map(|h| (h.name, h.value))
                        .collect::<Vec<_>>(),
                )
            };
            if let httparse::Status::Complete(n) = status {
                let mut len = 0;
                let mut close = false;
                for (k, v) in hs {
                    if k.eq_ignore_ascii_case("content-length") {
                        len = std::str::from_utf8(v)
                            .ok()
                            .and_then(|v| v.trim().parse().ok())
                            .ok_or_else(|| std::io::Error::other("content-length"))?;
                    } else if k.eq_ignore_ascii_case("transfer-encoding") {
                        return Err(std::io::Error::other("chunked not handled"));
                    } else if k.eq_ignore_ascii_case("connection") {
                        close = v.eq_ignore_ascii_case(b"close");
                    }
                }
                return Ok(Some((n, len, close)));
            }
        }
        if tcp.read_buf(buf).await? == 0 {
            return Ok(None);
        }
    }
}

async fn read_to(tcp: &mut TcpStream, buf: &mut BytesMut, want: usize) -> std::io::Result<()> {
    while buf.len() < want {
        if tcp.read_buf(buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

async fn upstream(addr: SocketAddr) -> std::io::Result<Upstream> {
    if let Some(u) = POOL.with(|p| p.borrow_mut().pop()) {
        return Ok(u);
    }
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    Ok(Upstream {
        tcp,
        buf: BytesMut::with_capacity(8192),
    })
}

async fn serve(mut client: TcpStream, up_addr: SocketAddr) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    let host = format!("Host: {up_addr}\r\n");
    let mut buf = BytesMut::with_capacity(8192);
    let mut out = Vec::with_capacity(8192);
    loop {
        let Some((head_len, body_len, _)) = read_head(&mut client, &mut buf, true).await? else {
            return Ok(());
        };
        read_to(&mut client, &mut buf, head_len + body_len).await?;
        let body = &buf[head_len..head_len + body_len];
        if !body.is_empty()
            && serde_json::from_slice::<ModelOnly<'_>>(body).map_or(true, |m| m.model.is_empty())
        {
            client
                .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await?;
            buf.advance(head_len + body_len);
            continue;
        }
        // The upstream request: request line and headers but Host/Connection.
        out.clear();
        {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut r = httparse::Request::new(&mut headers);
            r.parse(&buf[..head_len]).map_err(std::io::Error::other)?;
            out.extend_from_slice(r.method.unwrap_or("GET").as_bytes());
            out.push(b' ');
            out.extend_from_slice(r.path.unwrap_or("/").as_bytes());
            out.extend_from_slice(b" HTTP/1.1\r\n");
            out.extend_from_slice(host.as_bytes());
            for h in r.headers.iter() {
                if h.name.eq_ignore_ascii_case("host") || h.name.eq_ignore_ascii_case("connection")
                {
                    continue;
                }
                out.extend_from_slice(h.name.as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(h.value);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(body);
        buf.advance(head_len + body_len);
        let mut up = upstream(up_addr).await?;
        up.tcp.write_all(&out).await?;
        let Some((rh, rlen, close)) = read_head(&mut up.tcp, &mut up.buf, false).await? else {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        };
        read_to(&mut up.tcp, &mut up.buf, rh + rlen).await?;
        client.write_all(&up.buf[..rh + rlen]).await?;
        up.buf.advance(rh + rlen);
        if !close {
            POOL.with(|p| p.borrow_mut().push(up));
        }
    }
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(listen), Some(up)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: raw_forwarder LISTEN_ADDR UPSTREAM_ADDR [WORKERS]");
        std::process::exit(64);
    };
    let listen: SocketAddr = listen.parse().map_err(std::io::Error::other)?;
    let up: SocketAddr = up
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .map_err(std::io::Error::other)?;
    let workers: usize = args.get(3).and_then(|w| w.parse().ok()).unwrap_or(2);
    let handles = workers::spawn(workers)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let mut next = 0;
        loop {
            let (tcp, _) = listener.accept().await?;
            let tcp = tcp.into_std()?;
            handles[next % workers].spawn(async move {
                if let Ok(tcp) = TcpStream::from_std(tcp) {
                    let _ = serve(tcp, up).await;
                }
            });
            next += 1;
        }
    })
}
