//! Which interface (and address) a process's sockets use: NCCL's `NCCL_SOCKET_IFNAME` rules
//! (also HCCL's `HCCL_SOCKET_IFNAME`, same syntax): a comma-separated list of name prefixes,
//! `=` before the list for exact names, `^` for an exclude list (`^=` both). Unset: the first
//! up, non-loopback interface with an IPv4 address, else loopback.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

/// A parsed `*_SOCKET_IFNAME` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfSpec {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfSpec {
    /// Parses `eth,ib`, `=eth0`, `^docker,lo`, `^=eth1`.
    pub fn parse(text: &str) -> IfSpec {
        let (exclude, rest) = match text.strip_prefix('^') {
            Some(r) => (true, r),
            None => (false, text),
        };
        let (exact, rest) = match rest.strip_prefix('=') {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let names = rest
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect();
        IfSpec {
            exclude,
            exact,
            names,
        }
    }

    /// Whether interface `name` is selected.
    pub fn matches(&self, name: &str) -> bool {
        let listed = self.names.iter().any(|n| {
            if self.exact {
                name == n
            } else {
                name.starts_with(n.as_str())
            }
        });
        listed != self.exclude
    }
}

/// One address of an up interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfAddr {
    pub name: String,
    pub ip: IpAddr,
    /// IPv6 scope (interface index) for link-local addresses, else 0.
    pub scope: u32,
    pub loopback: bool,
}

impl IfAddr {
    /// A socket address on this interface's address.
    pub fn socket_addr(&self, port: u16) -> SocketAddr {
        match self.ip {
            IpAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(v6, port, 0, self.scope)),
            ip => SocketAddr::new(ip, port),
        }
    }
}

/// The addresses of every up interface, in `getifaddrs` order.
pub fn interfaces() -> Vec<IfAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        let flags = ifa.ifa_flags;
        if ifa.ifa_addr.is_null() || flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-null and points at a sockaddr of the family it names.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let (ip, scope) = match family {
            libc::AF_INET => {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                (
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))),
                    0,
                )
            }
            libc::AF_INET6 => {
                // SAFETY: an AF_INET6 address is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                (
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)),
                    sin6.sin6_scope_id,
                )
            }
            _ => continue,
        };
        out.push(IfAddr {
            name,
            ip,
            scope,
            loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
        });
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// Picks the interface address for `spec` (the value of `*_SOCKET_IFNAME`, if set) among
/// `ifs`: with a spec, the first matching interface's IPv4 address, else its first IPv6
/// address; without one, the first non-loopback IPv4 address, else loopback's. `None` when
/// nothing matches.
pub fn choose(spec: Option<&IfSpec>, ifs: &[IfAddr]) -> Option<IfAddr> {
    match spec {
        Some(spec) => {
            let matching: Vec<&IfAddr> = ifs.iter().filter(|a| spec.matches(&a.name)).collect();
            let first = matching.first()?;
            let same: Vec<&&IfAddr> = matching.iter().filter(|a| a.name == first.name).collect();
            same.iter()
                .find(|a| a.ip.is_ipv4())
                .or_else(|| same.first())
                .map(|a| (**a).clone())
        }
        None => ifs
            .iter()
            .find(|a| !a.loopback && a.ip.is_ipv4())
            .or_else(|| ifs.iter().find(|a| a.loopback && a.ip.is_ipv4()))
            .or_else(|| ifs.iter().find(|a| a.loopback))
            .cloned(),
    }
}

/// The interface this process's sockets use: the one holding the address in `ip_var`
/// (`HCCL_IF_IP`, which HCCL prefers to `HCCL_SOCKET_IFNAME`) when that is set, else the
/// one the environment variable `var` (`NCCL_SOCKET_IFNAME`, `HCCL_SOCKET_IFNAME`) selects;
/// or why there is none.
pub fn from_env(var: &str, ip_var: Option<&str>) -> Result<IfAddr, String> {
    if let Some((ip_var, value)) = ip_var.and_then(|v| Some((v, std::env::var(v).ok()?))) {
        let ip: IpAddr = value
            .trim()
            .parse()
            .map_err(|e| format!("{ip_var}={value}: {e}"))?;
        return interfaces()
            .into_iter()
            .find(|a| a.ip == ip)
            .ok_or_else(|| format!("no up interface holds {ip_var}={value}"));
    }
    let value = std::env::var(var).ok().filter(|v| !v.trim().is_empty());
    let spec = value.as_deref().map(IfSpec::parse);
    let ifs = interfaces();
    choose(spec.as_ref(), &ifs).ok_or_else(|| match &value {
        Some(v) => format!("no up interface with an address matches {var}={v}"),
        None => "no up interface with an address".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(name: &str, ip: &str, loopback: bool) -> IfAddr {
        IfAddr {
            name: name.to_owned(),
            ip: ip.parse().unwrap(),
            scope: 0,
            loopback,
        }
    }

    fn ifs() -> Vec<IfAddr> {
        vec![
            addr("lo", "127.0.0.1", true),
            addr("docker0", "172.17.0.1", false),
            addr("eth0", "fe80::1", false),
            addr("eth0", "10.0.0.5", false),
            addr("eth10", "10.1.0.5", false),
            addr("veth7", "10.9.0.1", false),
        ]
    }

    #[test]
    fn prefix_exact_and_exclude_follow_nccl() {
        let pick = |s: &str| choose(Some(&IfSpec::parse(s)), &ifs()).map(|a| a.ip.to_string());
        assert_eq!(
            pick("eth").as_deref(),
            Some("10.0.0.5"),
            "IPv4 of eth0 first"
        );
        assert_eq!(pick("=eth10").as_deref(), Some("10.1.0.5"));
        assert_eq!(pick("=eth1"), None, "exact: eth1 is not eth10");
        assert_eq!(
            pick("eth1").as_deref(),
            Some("10.1.0.5"),
            "prefix: eth1 picks eth10"
        );
        assert_eq!(pick("^lo,docker").as_deref(), Some("10.0.0.5"));
        assert_eq!(pick("^=lo,docker0,eth0,eth10").as_deref(), Some("10.9.0.1"));
        assert_eq!(
            pick("veth7,eth").as_deref(),
            Some("10.0.0.5"),
            "getifaddrs order"
        );
        assert_eq!(pick("ib"), None);
    }

    #[test]
    fn unset_takes_the_first_non_loopback_ipv4_else_loopback() {
        assert_eq!(choose(None, &ifs()).unwrap().name, "docker0");
        let only_lo = vec![addr("lo", "::1", true), addr("lo", "127.0.0.1", true)];
        assert_eq!(choose(None, &only_lo).unwrap().ip.to_string(), "127.0.0.1");
        assert_eq!(choose(None, &[]), None);
    }

    #[test]
    fn this_machine_has_loopback() {
        let lo = choose(Some(&IfSpec::parse("=lo")), &interfaces()).expect("lo is up");
        assert!(lo.loopback && lo.ip.is_loopback(), "{lo:?}");
    }
}
