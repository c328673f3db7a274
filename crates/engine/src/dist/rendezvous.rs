//! Multi-process launch: who am I, how many are we, and the collective library's unique id.
//!
//! The environment is torchrun's: `RANK`, `WORLD_SIZE`, `LOCAL_RANK` (the GPU on this node),
//! `MASTER_ADDR` and `MASTER_PORT` (where rank 0 listens). Rank 0 creates the NCCL/RCCL unique
//! id and serves it over TCP; every other rank connects (retrying until rank 0 is up), says
//! who it is, and receives the id. The handshake also carries the world size and a tag (a hash
//! of the run's configuration), so ranks started with different settings fail at once with a
//! clear message instead of hanging inside the collective library.
//!
//! torchrun's agent on node 0 serves its own store on `MASTER_PORT`, so under torchrun duet's
//! rank 0 cannot listen there: `DUET_RENDEZVOUS_PORT` (the same on every rank) names another
//! port for duet's handshake.

use crate::{EngineError, Result};
use duet_device::DeviceError;
use duet_device::knobs::Knobs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 8] = b"DUETRDZ1";
/// Largest payload accepted (unique ids are 128 bytes).
const MAX_PAYLOAD: u32 = 1 << 20;
/// The port of duet's handshake when it must differ from `MASTER_PORT` (torchrun;
/// [`Knobs::rendezvous_port`]).
pub use duet_device::knobs::RENDEZVOUS_PORT as PORT_ENV;
/// How long ranks wait for each other by default (`DUET_RENDEZVOUS_TIMEOUT` seconds overrides:
/// [`Knobs::rendezvous_timeout`]).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// One process's place in a multi-process run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    pub rank: usize,
    pub world_size: usize,
    /// The device ordinal on this node.
    pub local_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
}

fn rdzv_err(message: impl Into<String>) -> EngineError {
    EngineError::Config(format!("rendezvous: {}", message.into()))
}

impl LaunchEnv {
    /// Reads the torchrun variables through `get` (and [`PORT_ENV`], parsed by
    /// [`Knobs::from_vars`] from the same `get`); `Ok(None)` when `RANK` and `WORLD_SIZE` are
    /// both unset (a single-process run).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let knobs = Knobs::from_vars(&get).map_err(DeviceError::from)?;
        Self::from_knobs(get, &knobs)
    }

    /// [`LaunchEnv::from_vars`] on the process environment (and the process's
    /// [`duet_device::knobs::knobs`]).
    pub fn from_env() -> Result<Option<Self>> {
        Self::from_knobs(
            |k| std::env::var(k).ok().filter(|v| !v.is_empty()),
            duet_device::knobs::device_knobs()?,
        )
    }

    /// The torchrun variables from `get`, duet's own from `knobs`.
    fn from_knobs(get: impl Fn(&str) -> Option<String>, knobs: &Knobs) -> Result<Option<Self>> {
        let (rank, world) = (get("RANK"), get("WORLD_SIZE"));
        if rank.is_none() && world.is_none() {
            return Ok(None);
        }
        let num = |name: &str, v: Option<String>| -> Result<usize> {
            let v = v.ok_or_else(|| rdzv_err(format!("{name} is not set")))?;
            v.trim()
                .parse()
                .map_err(|_| rdzv_err(format!("{name}={v:?} is not a number")))
        };
        let rank = num("RANK", rank)?;
        let world_size = num("WORLD_SIZE", world)?;
        if world_size == 0 || rank >= world_size {
            return Err(rdzv_err(format!(
                "RANK={rank} must be below WORLD_SIZE={world_size}"
            )));
        }
        let local_rank = match get("LOCAL_RANK") {
            Some(v) => num("LOCAL_RANK", Some(v))?,
            None => rank,
        };
        let master_addr = get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        let master_port = match (knobs.rendezvous_port, get("MASTER_PORT")) {
            (Some(p), _) => p,
            (None, Some(v)) => v
                .trim()
                .parse()
                .map_err(|_| rdzv_err(format!("MASTER_PORT={v:?} is not a port")))?,
            (None, None) if world_size == 1 => 0,
            (None, None) => return Err(rdzv_err("MASTER_PORT is not set")),
        };
        Ok(Some(Self {
            rank,
            world_size,
            local_rank,
            master_addr,
            master_port,
        }))
    }

    /// Rank 0 serves `make_payload()`'s bytes to every other rank; every rank returns them.
    /// `tag` must be equal on every rank.
    pub fn share(
        &self,
        tag: u64,
        make_payload: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        let timeout = duet_device::knobs::device_knobs()?
            .rendezvous_timeout
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs);
        if self.world_size == 1 {
            return make_payload();
        }
        if self.rank == 0 {
            let listener = bind(&self.master_addr, self.master_port)?;
            let payload = make_payload()?;
            serve(&listener, self.world_size, tag, &payload, timeout)?;
            Ok(payload)
        } else {
            join(
                &self.master_addr,
                self.master_port,
                self.rank,
                self.world_size,
                tag,
                timeout,
            )
        }
    }
}

/// Binds rank 0's listener on `addr:port` (all interfaces when `addr` is not local).
pub fn bind(addr: &str, port: u16) -> Result<TcpListener> {
    TcpListener::bind((addr, port))
        .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
        .map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
                format!(
                    " (under torchrun its agent serves a store on MASTER_PORT: set {PORT_ENV} to \
                     a free port, the same on every rank)"
                )
            } else {
                String::new()
            };
            rdzv_err(format!("rank 0 cannot listen on {addr}:{port}: {e}{hint}"))
        })
}

fn io(what: &str, e: std::io::Error) -> EngineError {
    rdzv_err(format!("{what}: {e}"))
}

/// Rank 0's side: accepts `world − 1` ranks, checks each one's rank, world size and tag, and
/// sends them `payload`. Fails (telling the offending rank why) on a duplicate rank or a
/// mismatch, and when not everyone arrived within `timeout`.
pub fn serve(
    listener: &TcpListener,
    world: usize,
    tag: u64,
    payload: &[u8],
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    listener
        .set_nonblocking(true)
        .map_err(|e| io("listener", e))?;
    let mut seen = vec![false; world];
    seen[0] = true;
    let mut pending: Vec<(usize, TcpStream)> = Vec::new();
    while pending.len() + 1 < world {
        let (mut s, peer) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    let missing: Vec<String> = (0..world)
                        .filter(|&r| !seen[r])
                        .map(|r| r.to_string())
                        .collect();
                    return Err(rdzv_err(format!(
                        "rank(s) {} did not join within {}s",
                        missing.join(", "),
                        timeout.as_secs()
                    )));
                }
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => return Err(io("accept", e)),
        };
        s.set_nonblocking(false).map_err(|e| io("socket", e))?;
        s.set_read_timeout(Some(timeout))
            .map_err(|e| io("socket", e))?;
        let mut hello = [0u8; 8 + 4 + 4 + 8];
        s.read_exact(&mut hello)
            .map_err(|e| io(&format!("reading the hello of {peer}"), e))?;
        if &hello[..8] != MAGIC {
            // Not one of ours (a port scanner, another program): ignore it.
            continue;
        }
        let rank = u32::from_le_bytes(hello[8..12].try_into().expect("4 bytes")) as usize;
        let their_world = u32::from_le_bytes(hello[12..16].try_into().expect("4 bytes")) as usize;
        let their_tag = u64::from_le_bytes(hello[16..24].try_into().expect("8 bytes"));
        let problem = if their_world != world {
            Some(format!(
                "rank {rank} has WORLD_SIZE={their_world}, rank 0 has {world}"
            ))
        } else if rank == 0 || rank >= world || seen[rank] {
            Some(format!("rank {rank} joined twice or is out of range"))
        } else if their_tag != tag {
            Some(format!(
                "rank {rank} was started with a different configuration than rank 0"
            ))
        } else {
            None
        };
        if let Some(p) = problem {
            let _ = send_reply(&mut s, 1, p.as_bytes());
            return Err(rdzv_err(p));
        }
        seen[rank] = true;
        pending.push((rank, s));
    }
    for (rank, mut s) in pending {
        send_reply(&mut s, 0, payload).map_err(|e| io(&format!("answering rank {rank}"), e))?;
    }
    Ok(())
}

fn send_reply(s: &mut TcpStream, status: u8, body: &[u8]) -> std::io::Result<()> {
    let mut msg = vec![status];
    msg.extend_from_slice(&(body.len() as u32).to_le_bytes());
    msg.extend_from_slice(body);
    s.write_all(&msg)?;
    s.flush()
}

/// A non-zero rank's side: connects to rank 0 (retrying until `timeout`), introduces itself
/// and returns rank 0's payload.
pub fn join(
    addr: &str,
    port: u16,
    rank: usize,
    world: usize,
    tag: u64,
    timeout: Duration,
) -> Result<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    let target: Vec<SocketAddr> = (addr, port)
        .to_socket_addrs()
        .map_err(|e| rdzv_err(format!("cannot resolve MASTER_ADDR {addr}: {e}")))?
        .collect();
    let mut s = loop {
        let attempt = target
            .iter()
            .find_map(|a| TcpStream::connect_timeout(a, Duration::from_secs(2)).ok());
        match attempt {
            Some(s) => break s,
            None if Instant::now() > deadline => {
                return Err(rdzv_err(format!(
                    "rank {rank} could not reach rank 0 at {addr}:{port} within {}s",
                    timeout.as_secs()
                )));
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    s.set_read_timeout(Some(timeout))
        .map_err(|e| io("socket", e))?;
    let mut hello = Vec::with_capacity(24);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    hello.extend_from_slice(&(world as u32).to_le_bytes());
    hello.extend_from_slice(&tag.to_le_bytes());
    s.write_all(&hello)
        .map_err(|e| io("sending the hello", e))?;
    let mut head = [0u8; 5];
    s.read_exact(&mut head)
        .map_err(|e| io("waiting for rank 0's answer", e))?;
    let len = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes"));
    if len > MAX_PAYLOAD {
        return Err(rdzv_err(format!("rank 0 announced {len} bytes")));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body)
        .map_err(|e| io("reading rank 0's answer", e))?;
    if head[0] != 0 {
        return Err(rdzv_err(format!(
            "rank 0 refused rank {rank}: {}",
            String::from_utf8_lossy(&body)
        )));
    }
    Ok(body)
}

/// A stable 64-bit hash (FNV-1a) of `bytes`, for rendezvous tags.
pub fn tag_of(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn torchrun_variables() {
        assert_eq!(LaunchEnv::from_vars(env(&[])).unwrap(), None);
        let e = LaunchEnv::from_vars(env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (
                e.rank,
                e.world_size,
                e.local_rank,
                e.master_addr.as_str(),
                e.master_port
            ),
            (3, 4, 1, "node0", 29500)
        );
        // DUET_RENDEZVOUS_PORT takes the handshake off torchrun's store port.
        let e = LaunchEnv::from_vars(env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "29500"),
            ("DUET_RENDEZVOUS_PORT", "29501"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(e.master_port, 29501);
        let bad = env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "29500"),
            ("DUET_RENDEZVOUS_PORT", "x"),
        ]);
        let err = LaunchEnv::from_vars(bad).unwrap_err().to_string();
        assert!(
            err.contains("DUET_RENDEZVOUS_PORT=\"x\" is not a port"),
            "{err}"
        );
        for bad in [
            vec![("RANK", "4"), ("WORLD_SIZE", "4"), ("MASTER_PORT", "1")],
            vec![("RANK", "0"), ("WORLD_SIZE", "2")],
            vec![("RANK", "x"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")],
            vec![("WORLD_SIZE", "2"), ("MASTER_PORT", "1")],
        ] {
            assert!(LaunchEnv::from_vars(env(&bad)).is_err(), "{bad:?}");
        }
    }

    /// Four ranks on loopback, the non-zero ones started before rank 0 listens.
    #[test]
    fn loopback_rendezvous_hands_out_the_payload() {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let world = 4;
        let clients: Vec<_> = (1..world)
            .map(|r| {
                std::thread::spawn(move || {
                    let e = LaunchEnv {
                        rank: r,
                        world_size: world,
                        local_rank: r,
                        master_addr: "127.0.0.1".into(),
                        master_port: port,
                    };
                    e.share(7, || panic!("only rank 0 makes the payload"))
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        let e0 = LaunchEnv {
            rank: 0,
            world_size: world,
            local_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: port,
        };
        let id: Vec<u8> = (0..128u8).collect();
        let served = e0.share(7, || Ok(id.clone())).unwrap();
        assert_eq!(served, id);
        for c in clients {
            assert_eq!(c.join().unwrap().unwrap(), id);
        }
    }

    #[test]
    fn mismatched_configuration_is_refused_by_name() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let client =
            std::thread::spawn(move || join("127.0.0.1", port, 1, 2, 99, Duration::from_secs(10)));
        let served = serve(&listener, 2, 1, b"id", Duration::from_secs(10));
        let e = served.unwrap_err().to_string();
        assert!(e.contains("different configuration"), "{e}");
        let e = client.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("refused rank 1"), "{e}");
    }

    #[test]
    fn a_missing_rank_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = serve(&listener, 3, 0, b"", Duration::from_millis(200))
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank(s) 1, 2 did not join"), "{e}");
    }

    #[test]
    fn tags_differ_for_different_configs() {
        assert_ne!(tag_of(b"batch = 16"), tag_of(b"batch = 32"));
        assert_eq!(tag_of(b"x"), tag_of(b"x"));
    }
}
