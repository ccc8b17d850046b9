//! The output of `scontrol show node[s]` (without `-o`), as Slurm 22.05 prints it
//! (`slurm_sprint_node_table`, src/api/node_info.c at tag slurm-22-05-8-1): one record per
//! node, opened by a `NodeName=` line, continued by lines indented with three spaces and
//! closed by a blank line. Most lines hold `Key=value` pairs split by spaces; a few keys take
//! the rest of their line (`OS=Linux 6.1.0 #1 SMP ...`, `Reason=...`, `Comment=`, the feature,
//! GRES and TRES lists), and the `Reason=` line ends with ` [user@time]` when Slurm knows who
//! set it. A reason of several lines continues on lines indented by ten spaces. The state is
//! `BASE+FLAG+FLAG` (`node_state_string_complete`, src/common/slurm_protocol_defs.c):
//! `IDLE+DRAIN`, `UNKNOWN+DRAIN+NOT_RESPONDING`, `MIXED+DRAIN+RESERVED`.

/// Why the text is not what `scontrol show nodes` prints.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NodesError {
    #[error("line {line}: {what} (not scontrol show nodes output)")]
    Malformed { line: usize, what: String },
    #[error("node {node}: no State= field")]
    NoState { node: String },
}

/// One node as `scontrol show node` describes it (the fields chd acts on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub state: NodeState,
    /// The partitions it belongs to (`Partitions=a,b`; none when the line is absent).
    pub partitions: Vec<String>,
    /// Why it is drained or down, without the ` [user@time]` Slurm appends; lines of a
    /// reason of several lines joined with `\n`.
    pub reason: Option<String>,
    /// Who set the reason and when (`root@2024-05-02T10:11:12`), when Slurm says.
    pub reason_by: Option<String>,
    /// The address Slurm reaches it at (`NodeAddr=`; the name itself where it is not set).
    pub addr: Option<String>,
}

/// A node state: its base (`IDLE`, `ALLOCATED`, `MIXED`, `DOWN`, `UNKNOWN`, `ERROR`,
/// `FUTURE`) and flags (`DRAIN`, `NOT_RESPONDING`, `RESERVED`, `MAINTENANCE`, `FAIL`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub base: String,
    pub flags: Vec<String>,
}

impl NodeState {
    /// `IDLE+DRAIN` -> base `IDLE`, flags `[DRAIN]`.
    pub fn parse(text: &str) -> NodeState {
        let mut parts = text.split('+');
        let base = parts.next().unwrap_or_default().to_string();
        NodeState {
            base,
            flags: parts.map(str::to_string).collect(),
        }
    }

    pub fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// Drained or draining (the `DRAIN` flag, whatever the base).
    pub fn drain(&self) -> bool {
        self.has("DRAIN")
    }

    /// Down, failing or not responding: Slurm's business, never chd's.
    pub fn down(&self) -> bool {
        self.base == "DOWN" || self.has("FAIL") || self.has("NOT_RESPONDING")
    }

    /// In a reservation or a maintenance window.
    pub fn reserved(&self) -> bool {
        self.has("RESERVED") || self.has("MAINTENANCE")
    }
}

impl std::fmt::Display for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.base)?;
        for flag in &self.flags {
            write!(f, "+{flag}")?;
        }
        Ok(())
    }
}

/// Keys whose value is the rest of their line (it may hold spaces).
const WHOLE_LINE: [&str; 11] = [
    "OS",
    "Reason",
    "Comment",
    "Extra",
    "AvailableFeatures",
    "ActiveFeatures",
    "Gres",
    "GresDrain",
    "GresUsed",
    "CfgTRES",
    "AllocTRES",
];

/// A record being read.
#[derive(Default)]
struct Record {
    name: String,
    state: Option<String>,
    partitions: Vec<String>,
    reason: Option<String>,
    reason_by: Option<String>,
    addr: Option<String>,
    /// The last line read was the reason's (a continuation may follow).
    in_reason: bool,
}

impl Record {
    fn finish(self) -> Result<Node, NodesError> {
        let Some(state) = self.state else {
            return Err(NodesError::NoState { node: self.name });
        };
        Ok(Node {
            name: self.name,
            state: NodeState::parse(&state),
            partitions: self.partitions,
            reason: self.reason,
            reason_by: self.reason_by,
            addr: self.addr,
        })
    }

    fn field(&mut self, key: &str, value: &str) {
        match key {
            "State" => self.state = Some(value.to_string()),
            "NodeAddr" if !value.is_empty() => self.addr = Some(value.to_string()),
            "Partitions" => {
                self.partitions = value
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(str::to_string)
                    .collect();
            }
            "Reason" => {
                let (text, by) = split_reason_by(value);
                self.reason = Some(text.to_string());
                self.reason_by = by.map(str::to_string);
                self.in_reason = true;
            }
            _ => {}
        }
    }
}

/// `chd: slow [root@2024-05-02T10:11:12]` -> (`chd: slow`, `root@2024-05-02T10:11:12`).
fn split_reason_by(value: &str) -> (&str, Option<&str>) {
    if let Some(inner) = value.strip_suffix(']') {
        if let Some(at) = inner.rfind(" [") {
            let by = &inner[at + 2..];
            if by.contains('@') && !by.contains(' ') {
                return (&value[..at], Some(by));
            }
        }
    }
    (value, None)
}

/// Every node record of `text`.
pub fn parse(text: &str) -> Result<Vec<Node>, NodesError> {
    let mut nodes = Vec::new();
    let mut current: Option<Record> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_end();
        if line.is_empty() {
            if let Some(record) = current.take() {
                nodes.push(record.finish()?);
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("NodeName=") {
            if let Some(record) = current.take() {
                nodes.push(record.finish()?);
            }
            let name = rest.split(' ').next().unwrap_or_default();
            let mut record = Record {
                name: name.to_string(),
                ..Record::default()
            };
            for pair in rest.split(' ').skip(1) {
                if let Some((k, v)) = pair.split_once('=') {
                    record.field(k, v);
                }
            }
            current = Some(record);
            continue;
        }
        let Some(record) = current.as_mut() else {
            return Err(NodesError::Malformed {
                line: i + 1,
                what: format!("{line:?} before any NodeName= line"),
            });
        };
        if !raw.starts_with(' ') {
            return Err(NodesError::Malformed {
                line: i + 1,
                what: format!("{line:?} is neither a NodeName= line nor indented"),
            });
        }
        // A reason of several lines: its later lines are indented by ten spaces.
        if record.in_reason && raw.starts_with("          ") {
            if let Some(reason) = record.reason.as_mut() {
                reason.push('\n');
                reason.push_str(line.trim_start());
            }
            continue;
        }
        record.in_reason = false;
        let body = line.trim_start();
        let Some((key, value)) = body.split_once('=') else {
            return Err(NodesError::Malformed {
                line: i + 1,
                what: format!("{body:?} has no Key=value"),
            });
        };
        if WHOLE_LINE.contains(&key) {
            record.field(key, value);
            continue;
        }
        for pair in body.split(' ') {
            if let Some((k, v)) = pair.split_once('=') {
                record.field(k, v);
            }
        }
    }
    if let Some(record) = current.take() {
        nodes.push(record.finish()?);
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `scontrol show nodes` of Debian bookworm's Slurm 22.05.8 (a one-node test cluster with
    /// four configured nodes that never registered; two drained by chd, one by an admin).
    const BOOKWORM_22_05_8: &str = "\
NodeName=ghost1 CoresPerSocket=1 
   CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=N/A
   AvailableFeatures=(null)
   ActiveFeatures=(null)
   Gres=(null)
   NodeAddr=127.0.0.1 NodeHostName=ghost1 Port=16899 
   RealMemory=100 AllocMem=0 FreeMem=N/A Sockets=1 Boards=1
   State=UNKNOWN+DRAIN+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=debug 
   BootTime=None SlurmdStartTime=None
   LastBusyTime=Unknown
   CfgTRES=cpu=1,mem=100M,billing=1
   AllocTRES=
   CapWatts=n/a
   CurrentWatts=0 AveWatts=0
   ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
   Reason=chd: device 0 slow column (0.22 x the typical device) [root@2026-12-02T00:53:44]

NodeName=ghost3 CoresPerSocket=1 
   CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=N/A
   AvailableFeatures=(null)
   ActiveFeatures=(null)
   Gres=(null)
   NodeAddr=127.0.0.1 NodeHostName=ghost3 Port=16899 
   RealMemory=100 AllocMem=0 FreeMem=N/A Sockets=1 Boards=1
   State=UNKNOWN+DRAIN+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=debug 
   BootTime=None SlurmdStartTime=None
   LastBusyTime=Unknown
   CfgTRES=cpu=1,mem=100M,billing=1
   AllocTRES=
   CapWatts=n/a
   CurrentWatts=0 AveWatts=0
   ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
   Reason=maintenance: new PSU [root@2026-12-02T00:53:44]

NodeName=ghost4 CoresPerSocket=1 
   CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=N/A
   AvailableFeatures=(null)
   ActiveFeatures=(null)
   Gres=(null)
   NodeAddr=127.0.0.1 NodeHostName=ghost4 Port=16899 
   RealMemory=100 AllocMem=0 FreeMem=N/A Sockets=1 Boards=1
   State=UNKNOWN+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=debug 
   BootTime=None SlurmdStartTime=None
   LastBusyTime=Unknown
   CfgTRES=cpu=1,mem=100M,billing=1
   AllocTRES=
   CapWatts=n/a
   CurrentWatts=0 AveWatts=0
   ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s

NodeName=vm Arch=x86_64 CoresPerSocket=1 
   CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=2.09
   AvailableFeatures=(null)
   ActiveFeatures=(null)
   Gres=(null)
   NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8
   OS=Linux 6.18.44-fc-v1045 #1 SMP PREEMPT_DYNAMIC @0 
   RealMemory=100 AllocMem=0 FreeMem=9258 Sockets=2 Boards=1
   State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=debug 
   BootTime=2026-12-02T00:43:54 SlurmdStartTime=2026-12-02T00:53:33
   LastBusyTime=2026-12-02T00:53:33
   CfgTRES=cpu=2,mem=100M,billing=2
   AllocTRES=
   CapWatts=n/a
   CurrentWatts=0 AveWatts=0
   ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s

";

    #[test]
    fn bookworm_22_05_8_nodes_their_states_partitions_and_reasons() {
        let nodes = parse(BOOKWORM_22_05_8).unwrap();
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["ghost1", "ghost3", "ghost4", "vm"]);
        let ghost1 = &nodes[0];
        assert_eq!(ghost1.state.base, "UNKNOWN");
        assert_eq!(ghost1.state.flags, ["DRAIN", "NOT_RESPONDING"]);
        assert!(ghost1.state.drain() && ghost1.state.down());
        assert_eq!(ghost1.partitions, ["debug"]);
        assert_eq!(
            ghost1.reason.as_deref(),
            Some("chd: device 0 slow column (0.22 x the typical device)")
        );
        assert_eq!(
            ghost1.reason_by.as_deref(),
            Some("root@2026-12-02T00:53:44")
        );
        assert_eq!(ghost1.addr.as_deref(), Some("127.0.0.1"), "NodeAddr");
        assert_eq!(nodes[1].reason.as_deref(), Some("maintenance: new PSU"));
        assert_eq!(nodes[2].reason, None);
        assert!(!nodes[2].state.drain());
        let vm = &nodes[3];
        assert_eq!(vm.state.to_string(), "IDLE");
        assert!(!vm.state.drain() && !vm.state.down() && !vm.state.reserved());
        assert_eq!(vm.reason, None);
    }

    #[test]
    fn a_reason_of_several_lines_and_several_partitions() {
        // As node_info.c prints a reason holding a newline: its second line is indented by
        // "\n   " then seven more spaces; only the first line carries [user@time].
        let text = "NodeName=n1 Arch=x86_64 CoresPerSocket=8 \n   \
            State=MIXED+DRAIN+RESERVED ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A\n   \
            Partitions=gpu,debug \n   \
            Reason=chd: device 0 slow column [slurm@2024-05-02T10:11:12]\n          \
            second line\n   \
            Comment=rack 4 = row b\n\n";
        let nodes = parse(text).unwrap();
        assert_eq!(nodes.len(), 1);
        let n = &nodes[0];
        assert_eq!(n.state.base, "MIXED");
        assert!(n.state.drain() && n.state.reserved() && !n.state.down());
        assert_eq!(n.partitions, ["gpu", "debug"]);
        assert_eq!(
            n.reason.as_deref(),
            Some("chd: device 0 slow column\nsecond line")
        );
        assert_eq!(n.reason_by.as_deref(), Some("slurm@2024-05-02T10:11:12"));
    }

    #[test]
    fn a_reason_without_who_and_brackets_of_its_own() {
        assert_eq!(
            split_reason_by("chd: link [x8 of x16]"),
            ("chd: link [x8 of x16]", None)
        );
        assert_eq!(split_reason_by("a [b@c]"), ("a", Some("b@c")));
    }

    #[test]
    fn not_scontrol_output_is_an_error_naming_the_line() {
        let err = parse("Node vm not found\n").unwrap_err();
        assert!(
            matches!(err, NodesError::Malformed { line: 1, .. }),
            "{err}"
        );
        let err = parse("NodeName=a\n   Partitions=x\n\n").unwrap_err();
        assert_eq!(err, NodesError::NoState { node: "a".into() });
        assert_eq!(parse("").unwrap(), Vec::<Node>::new());
    }
}
