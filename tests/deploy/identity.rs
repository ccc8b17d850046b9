//! chd's own identity (issue 30 items 4 and 9): the image's `chd` user, the DaemonSet's
//! securityContext, the init containers that hand directories to it and the web config
//! Secret's fsGroup all name the same dedicated uid and gid, never the shared 65534
//! ("nobody"); and the NFD init container's script, run here on a directory laid out as the
//! kubelet and an older chd leave it, does what its comment says.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

use serde_yaml::Value;

use crate::kubernetes::{builds, main_container, pod_template, K8S};
use crate::tools::{read, root, run, temp_dir};
use crate::yaml::{at, key, seq, text};

/// The image's `chd` user and group.
const ID: u32 = 9863;
const NOBODY: &str = "65534";
const NFD_DIR: &str = "/etc/kubernetes/node-feature-discovery/features.d";

/// An init container's command line, as one string.
fn init_command(pod_spec: &Value, name: &str, build: &str) -> Vec<String> {
    let init = seq(&at(pod_spec, "initContainers", build), build)
        .into_iter()
        .find(|i| at(i, "name", build).as_str() == Some(name))
        .unwrap_or_else(|| panic!("{build}: no init container {name}"));
    seq(&at(&init, "command", build), build)
        .iter()
        .map(|a| text(a, build))
        .collect()
}

#[test]
pub(crate) fn the_image_and_every_manifest_use_chds_own_uid_and_gid() {
    let dockerfile = read(&root().join(K8S).join("Dockerfile"));
    let lines: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let user: Vec<&&str> = lines.iter().filter(|l| l.starts_with("USER ")).collect();
    assert_eq!(user, [&format!("USER {ID}:{ID}").as_str()], "Dockerfile");
    let body = lines.join("\n");
    for needle in [
        format!("groupadd --gid {ID} chd"),
        format!("useradd --uid {ID} --gid {ID}"),
    ] {
        assert!(body.contains(&needle), "Dockerfile: no `{needle}`");
    }

    for (build, docs) in builds() {
        let text_of_build = serde_yaml::to_string(docs).unwrap();
        assert!(
            !text_of_build.contains(NOBODY),
            "{build}: 65534 (nobody) is shared with other workloads; use chd's {ID}"
        );
        let pod = pod_template(docs, build);
        let psc = at(&pod.spec, "securityContext", build);
        assert_eq!(
            at(&psc, "runAsUser", build).as_u64(),
            Some(ID.into()),
            "{build}"
        );
        assert_eq!(
            at(&psc, "runAsGroup", build).as_u64(),
            Some(ID.into()),
            "{build}"
        );
        assert_eq!(
            init_command(&pod.spec, "state-dir-owner", build),
            ["chown", &format!("{ID}:{ID}"), "/var/lib/chd"],
            "{build}"
        );
        let c = main_container(&pod, build);
        // The web config Secret is readable by chd through the pod's fsGroup only.
        let web_config = seq(&at(&c, "args", build), build)
            .iter()
            .any(|a| text(a, build).starts_with("--web.config.file="));
        if web_config {
            assert_eq!(
                at(&psc, "fsGroup", build).as_u64(),
                Some(ID.into()),
                "{build}"
            );
            let secret = seq(&at(&pod.spec, "volumes", build), build)
                .into_iter()
                .find(|v| key(v, "secret").is_some())
                .unwrap_or_else(|| panic!("{build}: no Secret volume"));
            let mode = at(&secret, "secret.defaultMode", build).as_u64().unwrap();
            assert_eq!(mode, 0o440, "{build}: the Secret's mode");
        }
        if build.ends_with("components/nfd") {
            let script = init_command(&pod.spec, "nfd-features-dir", build).join(" ");
            for needle in [format!("chgrp {ID} "), format!("chown -h {ID}:{ID} ")] {
                assert!(script.contains(&needle), "{build}: `{needle}` in {script}");
            }
        }
    }
}

/// Running as root here (as scripts/test.sh does), the script gets the real ids; otherwise
/// the invoking user's own, which it may give its files.
#[test]
pub(crate) fn the_nfd_init_script_hands_the_directory_and_an_older_chds_file_to_chd() {
    let (build, docs) = builds()
        .iter()
        .find(|(b, _)| b.ends_with("components/nfd"))
        .expect("the nfd build");
    let pod = pod_template(docs, build);
    let command = init_command(&pod.spec, "nfd-features-dir", build);
    assert_eq!(&command[..2], ["sh", "-c"], "{command:?}");
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let root_here = uid == 0;
    let (want_uid, want_gid) = if root_here { (ID, ID) } else { (uid, gid) };

    for planted in ["file", "symlink"] {
        let dir = temp_dir();
        let features = dir.path().join("features.d");
        std::fs::create_dir(&features).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "someone else's\n").unwrap();
        let chd_file = features.join("chd");
        match planted {
            "file" => std::fs::write(&chd_file, "written by an older chd\n").unwrap(),
            _ => std::os::unix::fs::symlink(&victim, &chd_file).unwrap(),
        }
        if root_here {
            std::os::unix::fs::lchown(&chd_file, Some(65534), Some(65534)).unwrap();
        }
        let script = localise(&command[2], &features, want_uid, want_gid);
        run(Command::new("sh").args(["-c", &script])).expect_success();

        let d = std::fs::metadata(&features).unwrap();
        assert_eq!(d.gid(), want_gid, "{planted}: the directory's group");
        assert_eq!(d.permissions().mode() & 0o7777, 0o1775, "{planted}");
        let f = std::fs::symlink_metadata(&chd_file).unwrap();
        assert_eq!(
            (f.uid(), f.gid()),
            (want_uid, want_gid),
            "{planted}: chd's file"
        );
        let v = std::fs::metadata(&victim).unwrap();
        assert_eq!(v.uid(), uid, "{planted}: the symlink's target was chowned");
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "someone else's\n"
        );
    }
    // And an empty directory (a fresh node) is fine too.
    let dir = temp_dir();
    let script = localise(&command[2], dir.path(), want_uid, want_gid);
    run(Command::new("sh").args(["-c", &script])).expect_success();
}

/// The init script pointed at `dir`, giving `uid` and `gid` where it gives chd's.
fn localise(script: &str, dir: &std::path::Path, uid: u32, gid: u32) -> String {
    script
        .replace(NFD_DIR, dir.to_str().unwrap())
        .replace(&format!("chgrp {ID} "), &format!("chgrp {gid} "))
        .replace(&format!("{ID}:{ID}"), &format!("{uid}:{gid}"))
}
