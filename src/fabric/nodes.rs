//! The nodes of a fabric schedule: names checked once where they enter, from a list argument
//! (`a,b,node[01-04]`) or a file of one node per line (`#` comments; a line may be a hostlist
//! too, as `scontrol show hostnames` output is a file of plain names), every node once.

use std::fmt;

use thiserror::Error;

use super::hostlist::{self, HostlistError};

/// One node's name: ASCII letters, digits, `-`, `.` and `_` (a host name, a Slurm node name,
/// a Kubernetes node name), so it prints unquoted in text and in shell.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeName(String);

impl NodeName {
    /// The name, checked.
    pub fn new(name: &str) -> Result<NodeName, NodesError> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
        match name.chars().find(|c| !allowed(*c)) {
            None if !name.is_empty() => Ok(NodeName(name.to_string())),
            None => Err(NodesError::EmptyName),
            Some(c) => Err(NodesError::BadName {
                name: name.to_string(),
                character: c,
            }),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a node list was refused.
#[derive(Debug, Error, PartialEq)]
pub enum NodesError {
    #[error(transparent)]
    Hostlist(#[from] HostlistError),
    #[error("line {line}: {source}")]
    Line {
        line: usize,
        #[source]
        source: Box<NodesError>,
    },
    #[error("an empty node name")]
    EmptyName,
    #[error("node name {name:?}: {character:?} is not a letter, digit, '-', '.' or '_'")]
    BadName { name: String, character: char },
    #[error("node {name} is listed twice (as node {first} and node {second})")]
    Duplicate {
        name: String,
        first: usize,
        second: usize,
    },
    #[error("no nodes listed")]
    Empty,
}

/// Distinct nodes in the order they were listed.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeList(Vec<NodeName>);

impl NodeList {
    /// The nodes of a list argument: a hostlist (`a,b`, `node[01-04,07]`, whitespace too).
    pub fn from_list(list: &str) -> Result<NodeList, NodesError> {
        NodeList::from_names(hostlist::expand(list)?)
    }

    /// The nodes of a file's text: one node (or hostlist) per line; `#` starts a comment,
    /// blank lines are skipped. Errors name the line.
    pub fn from_file_text(text: &str) -> Result<NodeList, NodesError> {
        let mut names = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let content = line.split('#').next().unwrap_or("");
            let expanded = hostlist::expand(content).map_err(|e| NodesError::Line {
                line: i + 1,
                source: Box::new(e.into()),
            })?;
            for name in expanded {
                NodeName::new(&name).map_err(|e| NodesError::Line {
                    line: i + 1,
                    source: Box::new(e),
                })?;
                names.push(name);
            }
        }
        NodeList::from_names(names)
    }

    /// Names checked and every one distinct; at least one.
    fn from_names(names: Vec<String>) -> Result<NodeList, NodesError> {
        let mut nodes: Vec<NodeName> = Vec::with_capacity(names.len());
        let mut seen = std::collections::HashMap::with_capacity(names.len());
        for name in names {
            let node = NodeName::new(&name)?;
            if let Some(first) = seen.insert(node.clone(), nodes.len() + 1) {
                return Err(NodesError::Duplicate {
                    name,
                    first,
                    second: nodes.len() + 1,
                });
            }
            nodes.push(node);
        }
        if nodes.is_empty() {
            return Err(NodesError::Empty);
        }
        Ok(NodeList(nodes))
    }

    pub fn nodes(&self) -> &[NodeName] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true: a list holds at least one node.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &NodeList) -> Vec<&str> {
        list.nodes().iter().map(NodeName::as_str).collect()
    }

    #[test]
    fn a_list_argument_is_a_hostlist() {
        let list = NodeList::from_list("gpu-a,node[01-02] gpu_b.rack3").unwrap();
        assert_eq!(names(&list), ["gpu-a", "node01", "node02", "gpu_b.rack3"]);
    }

    #[test]
    fn a_file_has_one_node_per_line_and_comments() {
        let text = "# fleet A\nnode01\n  node02   # rack 2\n\nnode[03-04]\n#node05\n";
        let list = NodeList::from_file_text(text).unwrap();
        assert_eq!(names(&list), ["node01", "node02", "node03", "node04"]);
    }

    #[test]
    fn duplicates_name_the_node_and_both_places() {
        let error = NodeList::from_list("a,node[1-3],node2").unwrap_err();
        assert_eq!(
            error.to_string(),
            "node node2 is listed twice (as node 3 and node 5)"
        );
        assert!(NodeList::from_file_text("x\ny\nx\n").is_err());
    }

    #[test]
    fn nothing_listed_is_an_error_not_an_empty_schedule() {
        assert_eq!(NodeList::from_list(" , ").unwrap_err(), NodesError::Empty);
        assert_eq!(
            NodeList::from_file_text("# only a comment\n\n").unwrap_err(),
            NodesError::Empty
        );
    }

    #[test]
    fn bad_names_and_bad_lines_say_where() {
        let error = NodeList::from_list("a,b/c").unwrap_err().to_string();
        assert!(
            error.contains("\"b/c\"") && error.contains("'/'"),
            "{error}"
        );
        let error = NodeList::from_file_text("a\nb[1-\n")
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("line 2: hostlist \"b[1-\""), "{error}");
        let error = NodeList::from_file_text("a\nb\nc:1\n")
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("line 3: node name \"c:1\""), "{error}");
    }
}
