//! The fleet's routing and shared state: BIRD on the router and each balancer host, and etcd.

use super::*;

impl Fleet {
    /// etcd's client URL.
    pub fn etcd_url(&self) -> String {
        let scheme = if self.pki.is_some() { "https" } else { "http" };
        format!("{scheme}://{ETCD}:2379")
    }

    /// Starts etcd (again: its data directory stays, so a restart keeps the fleet's keys);
    /// a secured one gets its users at the first start.
    pub fn start_etcd(&mut self) -> Result<()> {
        let data = self.rack.log_dir.join("etcd-data");
        let first = !data.exists();
        let (client_url, peer_url) = (self.etcd_url(), format!("http://{ETCD}:2380"));
        let cluster = format!("e1={peer_url}");
        let mut argv: Vec<String> = [
            "etcd",
            "--name",
            "e1",
            "--data-dir",
            data.to_str().unwrap_or_default(),
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &cluster,
            "--initial-cluster-state",
            "new",
        ]
        .map(String::from)
        .to_vec();
        if let Some(pki) = &self.pki {
            argv.extend(pki.etcd_args());
        }
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        self.rack
            .spawn(&self.etcd, "etcd", &argv)?
            .wait_for_log("ready to serve client requests", Duration::from_secs(20))?;
        if first && let Some(pki) = &self.pki {
            let (pki, url) = (pki.clone(), client_url.clone());
            self.etcd.run_in(move || pki.enable_auth(&url))??;
        }
        Ok(())
    }

    /// Kills etcd (the balancers lose their shared state store).
    pub fn kill_etcd(&mut self) -> Result<()> {
        self.rack.kill("etcd")
    }

    pub(super) fn bird_dir(&self) -> PathBuf {
        self.rack.log_dir.join("bird")
    }

    pub(super) fn start_router_bird(&mut self) -> Result<()> {
        let dir = self.bird_dir();
        fs::create_dir_all(&dir)?;
        let mut conf = format!(
            "log stderr all;\nrouter id {ROUTER_RACK};\n\
             protocol device {{ scan time 10; }}\n\
             protocol kernel {{\n  ipv4 {{ import none; export where source = RTS_BGP; }};\n  merge paths on;\n}}\n\
             template bgp lb {{\n  local {ROUTER_RACK} as 65000;\n  hold time {HOLD};\n  keepalive time 1;\n  \
             connect delay time 1;\n  connect retry time 1;\n  error wait time 1, 2;\n  \
             ipv4 {{ import all; export none; }};\n}}\n"
        );
        for i in 0..self.lbs.len() {
            conf.push_str(&format!(
                "protocol bgp lb{} from lb {{ neighbor {} as 65001; }}\n",
                i + 1,
                lb_addr(i)
            ));
        }
        let path = dir.join("router.conf");
        fs::write(&path, conf)?;
        self.spawn_bird(None, &path)
    }

    /// The BIRD config of balancer `i`: the VIP routes the daemon writes, exported to the router.
    pub(super) fn lb_bird_conf(&self, i: usize) -> String {
        let routes = self.bird_dir().join(format!("lb{}-vips4.conf", i + 1));
        let routes6 = self.bird_dir().join(format!("lb{}-vips6.conf", i + 1));
        format!(
            "log stderr all;\nrouter id {me};\n\
             protocol device {{ scan time 10; }}\n\
             protocol static vips4 {{\n  ipv4;\ninclude \"{r4}\";\n}}\n\
             protocol static vips6 {{\n  ipv6;\ninclude \"{r6}\";\n}}\n\
             protocol bgp uplink {{\n  local {me} as 65001;\n  neighbor {ROUTER_RACK} as 65000;\n  \
             hold time {HOLD};\n  keepalive time 1;\n  connect delay time 1;\n  connect retry time 1;\n  \
             error wait time 1, 2;\n  ipv4 {{ import none; export where proto = \"vips4\"; }};\n}}\n",
            me = lb_addr(i),
            r4 = routes.display(),
            r6 = routes6.display(),
        )
    }

    /// Starts balancer `i`'s BIRD (its route files must exist: empty ones until the daemon
    /// writes them).
    pub fn start_lb_bird(&mut self, i: usize) -> Result<()> {
        let dir = self.bird_dir();
        fs::create_dir_all(&dir)?;
        for family in ["vips4", "vips6"] {
            let f = dir.join(format!("lb{}-{family}.conf", i + 1));
            if !f.exists() {
                fs::write(&f, "")?;
            }
        }
        let path = dir.join(format!("lb{}.conf", i + 1));
        fs::write(&path, self.lb_bird_conf(i))?;
        self.spawn_bird(Some(i), &path)
    }

    pub(super) fn spawn_bird(&mut self, lb: Option<usize>, conf: &std::path::Path) -> Result<()> {
        let (name, ns) = match lb {
            Some(i) => (format!("bird-lb{}", i + 1), &self.lbs[i]),
            None => ("bird-router".to_string(), &self.router),
        };
        let socket = self.bird_socket(lb);
        let _ = fs::remove_file(&socket);
        let argv = [
            "bird",
            "-f",
            "-c",
            conf.to_str().unwrap_or_default(),
            "-s",
            socket.to_str().unwrap_or_default(),
        ];
        self.rack.spawn(ns, &name, &argv)?;
        self.rack.wait_until(
            Duration::from_secs(10),
            &format!("{name}'s control socket open"),
            || socket.exists(),
        )?;
        Ok(())
    }

    /// BIRD's control socket of balancer `lb` (None: the router).
    pub fn bird_socket(&self, lb: Option<usize>) -> PathBuf {
        match lb {
            Some(i) => self.bird_dir().join(format!("lb{}.ctl", i + 1)),
            None => self.bird_dir().join("router.ctl"),
        }
    }
}
