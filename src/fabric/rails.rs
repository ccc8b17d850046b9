//! The rails of a node on the host backend: its network interfaces with an address, each
//! paired with the peer's interface in the same subnet, as multi-rail fabrics are laid out
//! (rail k of every node in subnet k). Loopback is a rail only when `--rails` names it (ranks
//! that share a node).

use std::net::IpAddr;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// One rail: an interface and the address streams bind to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rail {
    pub name: String,
    pub address: IpAddr,
    /// The subnet's prefix length.
    pub prefix: u8,
    /// The CPUs its streams run on ([`super::placement`]); empty: unbound.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpus: Vec<u32>,
    /// The RDMA port the interface is (`mlx5_0:1`, [`super::nic`]); none for a plain NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_port: Option<String>,
    /// The NUMA node its network device sits on ([`super::nic`]); none for a virtual one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
}

impl Rail {
    /// Whether `other` is in this rail's subnet and its own (same prefix, same network).
    pub fn same_subnet(&self, other: &Rail) -> bool {
        self.prefix == other.prefix
            && network(self.address, self.prefix) == network(other.address, other.prefix)
    }
}

/// `addr` with the host bits cleared; `None` across address families.
fn network(addr: IpAddr, prefix: u8) -> Option<(bool, u128)> {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let mask = u32::MAX
                .checked_shl(32 - u32::from(prefix.min(32)))
                .unwrap_or(0);
            Some((false, u128::from(bits & mask)))
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let mask = u128::MAX
                .checked_shl(128 - u32::from(prefix.min(128)))
                .unwrap_or(0);
            Some((true, bits & mask))
        }
    }
}

/// Why the interfaces could not be listed or chosen.
#[derive(Debug, thiserror::Error)]
pub enum RailError {
    #[error("cannot list the network interfaces: {0}")]
    List(#[source] nix::Error),
    #[error("no rails: {0}")]
    None(String),
}

/// An address of an interface, as the kernel lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceAddress {
    pub interface: String,
    pub address: IpAddr,
    pub prefix: u8,
    pub loopback: bool,
}

/// Every IP address of every interface that is up.
pub fn interface_addresses() -> Result<Vec<InterfaceAddress>, RailError> {
    use nix::net::if_::InterfaceFlags;
    let mut out = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs().map_err(RailError::List)? {
        if !ifa.flags.contains(InterfaceFlags::IFF_UP) {
            continue;
        }
        let (Some(addr), Some(mask)) = (ifa.address, ifa.netmask) else {
            continue;
        };
        let (address, prefix) =
            if let (Some(a), Some(m)) = (addr.as_sockaddr_in(), mask.as_sockaddr_in()) {
                (IpAddr::V4(a.ip()), u32::from(m.ip()).count_ones() as u8)
            } else if let (Some(a), Some(m)) = (addr.as_sockaddr_in6(), mask.as_sockaddr_in6()) {
                (IpAddr::V6(a.ip()), u128::from(m.ip()).count_ones() as u8)
            } else {
                continue;
            };
        out.push(InterfaceAddress {
            interface: ifa.interface_name,
            address,
            prefix,
            loopback: ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK),
        });
    }
    Ok(out)
}

/// The rails among `addresses`: those whose interface matches `pattern` (loopback included
/// when it matches), else every interface but loopback. One rail per interface, its first
/// IPv4 address, else its first IPv6 address that is not link-local.
pub fn choose(
    addresses: &[InterfaceAddress],
    pattern: Option<&Regex>,
) -> Result<Vec<Rail>, RailError> {
    let mut rails: Vec<Rail> = Vec::new();
    let usable = |a: &&InterfaceAddress| match a.address {
        IpAddr::V4(_) => true,
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) != 0xfe80 && !v6.is_loopback() || a.loopback,
    };
    let wanted = |a: &&InterfaceAddress| match pattern {
        Some(p) => p.is_match(&a.interface),
        None => !a.loopback,
    };
    let mut candidates: Vec<&InterfaceAddress> =
        addresses.iter().filter(wanted).filter(usable).collect();
    // IPv4 first, then the kernel's order.
    candidates.sort_by_key(|a| a.address.is_ipv6());
    for a in candidates {
        if rails.iter().any(|r| r.name == a.interface) {
            continue;
        }
        rails.push(Rail {
            name: a.interface.clone(),
            address: a.address,
            prefix: a.prefix,
            cpus: Vec::new(),
            rdma_port: None,
            numa_node: None,
        });
    }
    rails.sort_by(|a, b| a.name.cmp(&b.name));
    if rails.is_empty() {
        let listed: Vec<String> = addresses
            .iter()
            .map(|a| format!("{} {}/{}", a.interface, a.address, a.prefix))
            .collect();
        return Err(RailError::None(match pattern {
            Some(p) => format!(
                "no interface with an address matches --rails {:?} (interfaces: {})",
                p.as_str(),
                listed.join(", ")
            ),
            None => format!(
                "no interface but loopback has an address (interfaces: {}); name the rails with --rails",
                listed.join(", ")
            ),
        }));
    }
    Ok(rails)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifa(name: &str, addr: &str, prefix: u8) -> InterfaceAddress {
        InterfaceAddress {
            interface: name.into(),
            address: addr.parse().unwrap(),
            prefix,
            loopback: name == "lo",
        }
    }

    #[test]
    fn rails_are_the_interfaces_with_an_address_loopback_only_when_named() {
        let all = vec![
            ifa("lo", "127.0.0.1", 8),
            ifa("lo", "::1", 128),
            ifa("eth1", "fe80::1", 64),
            ifa("eth1", "10.0.1.2", 24),
            ifa("eth0", "192.168.5.9", 24),
            ifa("eth2", "fd00::2", 64),
        ];
        let names = |r: Vec<Rail>| {
            r.into_iter()
                .map(|r| format!("{} {}", r.name, r.address))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(choose(&all, None).unwrap()),
            ["eth0 192.168.5.9", "eth1 10.0.1.2", "eth2 fd00::2"]
        );
        let lo = Regex::new("^lo$").unwrap();
        assert_eq!(names(choose(&all, Some(&lo)).unwrap()), ["lo 127.0.0.1"]);
        let none = Regex::new("^ib").unwrap();
        let e = choose(&all, Some(&none)).unwrap_err().to_string();
        assert!(
            e.contains("--rails \"^ib\"") && e.contains("eth1 10.0.1.2/24"),
            "{e}"
        );
        assert!(choose(&[ifa("lo", "127.0.0.1", 8)], None).is_err());
    }

    #[test]
    fn a_peer_rail_is_the_one_in_the_same_subnet() {
        let a = Rail {
            name: "v1".into(),
            address: "10.77.1.1".parse().unwrap(),
            prefix: 24,
            cpus: Vec::new(),
            rdma_port: None,
            numa_node: None,
        };
        let b = Rail {
            name: "v1".into(),
            address: "10.77.1.2".parse().unwrap(),
            prefix: 24,
            cpus: Vec::new(),
            rdma_port: None,
            numa_node: None,
        };
        let c = Rail {
            name: "v2".into(),
            address: "10.77.2.2".parse().unwrap(),
            prefix: 24,
            cpus: Vec::new(),
            rdma_port: None,
            numa_node: None,
        };
        let d = Rail {
            name: "v2".into(),
            address: "fd00::2".parse().unwrap(),
            prefix: 64,
            cpus: Vec::new(),
            rdma_port: None,
            numa_node: None,
        };
        assert!(a.same_subnet(&b));
        assert!(!a.same_subnet(&c));
        assert!(!a.same_subnet(&d));
        let lo = Rail {
            name: "lo".into(),
            address: "127.0.0.1".parse().unwrap(),
            prefix: 8,
            cpus: Vec::new(),
            rdma_port: None,
            numa_node: None,
        };
        assert!(lo.same_subnet(&lo.clone()));
    }

    #[test]
    fn this_machine_lists_loopback() {
        let all = interface_addresses().unwrap();
        assert!(all.iter().any(|a| a.loopback), "{all:?}");
    }
}
