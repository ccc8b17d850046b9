//! The collector flags of `chd serve`, generated at run time from the collector table
//! (`chd::collect::COLLECTORS`) with clap's builder API: `--collector.NAME` /
//! `--no-collector.NAME` per collector (the last one given wins), and `--collector.KEY` per
//! collector option (`--collector.netdev-all`, `--collector.hca-include REGEX`). Each help
//! line names its config key (`[collectors.NAME]`) and a switch's default.

use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};

use chd::collect::{registry, CollectorSpec, OptionField, COLLECTORS};
use chd::config::{CollectorsLayer, RawOption};

/// What the collector flags set: only what was given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CollectorArgs {
    pub layer: CollectorsLayer,
}

/// `HELP [collectors.NAME] (default on; off with --no-collector.NAME)`, or `(default off)`.
fn switch_help(spec: &CollectorSpec) -> String {
    let default = if spec.default_enabled {
        format!("default on; off with --{}", spec.no_flag())
    } else {
        "default off".to_string()
    };
    format!("{} [collectors.{}] ({default})", spec.help, spec.name)
}

impl Args for CollectorArgs {
    fn augment_args(cmd: Command) -> Command {
        let heading = cmd.get_next_help_heading().map(str::to_owned);
        let mut cmd = cmd.next_help_heading("Collectors");
        for spec in COLLECTORS {
            let (flag, no_flag) = (spec.flag(), spec.no_flag());
            cmd = cmd
                .arg(
                    Arg::new(flag.clone())
                        .long(flag)
                        .action(ArgAction::SetTrue)
                        .overrides_with(no_flag.clone())
                        .help(switch_help(spec)),
                )
                .arg(
                    Arg::new(no_flag.clone())
                        .long(no_flag)
                        .action(ArgAction::SetTrue)
                        .overrides_with(spec.flag())
                        .hide(true),
                );
        }
        for option in registry::options() {
            let flag = option.flag();
            let arg = Arg::new(flag.clone()).long(flag);
            let arg = match option.field {
                OptionField::Switch(_) => arg.action(ArgAction::SetTrue).help(format!(
                    "{} [collectors.{}] (default off)",
                    option.help, option.key
                )),
                OptionField::Pattern(_) => arg
                    .action(ArgAction::Set)
                    .value_name("REGEX")
                    .help(format!("{} [collectors.{}]", option.help, option.key)),
            };
            cmd = cmd.arg(arg);
        }
        // The heading applies to these flags only, not to those declared after them.
        match heading {
            Some(h) => cmd.next_help_heading(h),
            None => cmd.next_help_heading(None::<&str>),
        }
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for CollectorArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut layer = CollectorsLayer::default();
        for spec in COLLECTORS {
            if matches.get_flag(&spec.flag()) {
                layer.enabled.insert(spec.name, true);
            } else if matches.get_flag(&spec.no_flag()) {
                layer.enabled.insert(spec.name, false);
            }
        }
        for option in registry::options() {
            let flag = option.flag();
            let value = match option.field {
                OptionField::Switch(_) => {
                    matches.get_flag(&flag).then_some(RawOption::Switch(true))
                }
                OptionField::Pattern(_) => matches
                    .get_one::<String>(&flag)
                    .map(|t| RawOption::Pattern(t.clone())),
            };
            if let Some(value) = value {
                layer.options.insert(option.key, value);
            }
        }
        Ok(CollectorArgs { layer })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> CollectorsLayer {
        let cmd = CollectorArgs::augment_args(Command::new("serve"));
        let matches = cmd
            .try_get_matches_from(std::iter::once("serve").chain(args.iter().copied()))
            .unwrap();
        CollectorArgs::from_arg_matches(&matches).unwrap().layer
    }

    #[test]
    fn nothing_given_sets_nothing() {
        assert_eq!(parse(&[]), CollectorsLayer::default());
    }

    #[test]
    fn every_collector_has_both_switches_and_the_last_wins() {
        for spec in COLLECTORS {
            let (on, off) = (
                format!("--{}", spec.flag()),
                format!("--{}", spec.no_flag()),
            );
            assert_eq!(parse(&[&off]).enabled.get(spec.name), Some(&false));
            assert_eq!(parse(&[&off, &on]).enabled.get(spec.name), Some(&true));
            assert_eq!(parse(&[&on, &off]).enabled.get(spec.name), Some(&false));
        }
    }

    #[test]
    fn options_keep_their_spellings() {
        let layer = parse(&[
            "--collector.netdev-all",
            "--collector.hca-include",
            "^mlx5_",
            "--collector.hca-exclude=bond",
            "--collector.netdev-include",
            "^eth",
            "--collector.netdev-exclude",
            "^veth",
        ]);
        assert_eq!(
            layer.options.get("netdev_all"),
            Some(&RawOption::Switch(true))
        );
        for (key, text) in [
            ("hca_include", "^mlx5_"),
            ("hca_exclude", "bond"),
            ("netdev_include", "^eth"),
            ("netdev_exclude", "^veth"),
        ] {
            assert_eq!(
                layer.options.get(key),
                Some(&RawOption::Pattern(text.into())),
                "{key}"
            );
        }
    }

    #[test]
    fn help_lists_each_collector_with_its_key_and_default() {
        let help = CollectorArgs::augment_args(Command::new("serve").term_width(1000))
            .render_long_help()
            .to_string();
        for spec in COLLECTORS {
            let default = if spec.default_enabled { "on" } else { "off" };
            let line = format!(
                "{} [collectors.{}] (default {default}",
                spec.help, spec.name
            );
            assert!(help.contains(&format!("--{}", spec.flag())), "{help}");
            assert!(help.contains(&line), "{line} not in\n{help}");
        }
        for option in registry::options() {
            assert!(
                help.contains(&format!("[collectors.{}]", option.key)),
                "{help}"
            );
        }
    }
}
