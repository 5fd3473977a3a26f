//! The thin adapter between the kernel (via fuser) and [`TensorFs`]: converts
//! types and picks reply flags, nothing else.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr,
    Request,
};

use super::backing::{Behind, Filled};
use super::fs::{Attr, CacheMode, Kind, Open, TensorFs};
use super::tree::Ino;
use super::waiting::Waiting;
use crate::serve::stats::Stats;
use std::sync::atomic::Ordering::Relaxed;

/// Nothing in the tree ever changes, so the kernel may keep what it learns.
const TTL: Duration = Duration::from_secs(3600);

/// Most reads waiting for a decode off the FUSE workers at once.
const WAITING_READS: usize = 64;

pub struct Adapter {
    fs: Arc<TensorFs>,
    /// Threads for reads that would wait for a decode (see [`Waiting`]).
    waiting: Arc<Waiting>,
    uid: u32,
    gid: u32,
    time: SystemTime,
    /// Largest read the kernel may send (bytes).
    max_read: u32,
    /// Whether the kernel has let go of the mount, asked when the session
    /// ends (see `destroy`).
    unmounted: Box<dyn Fn() -> bool + Send + Sync>,
    /// Why passthrough is off, when it is off from the start.
    no_passthrough: Option<String>,
    /// The kernel's ids of backing files, held by each handle that uses one
    /// and found again by inode: every open of an inode must name the same
    /// id while any is open (the kernel refuses another file).
    backing_ids: Mutex<BackingIds>,
}

#[derive(Default)]
struct BackingIds {
    by_fh: HashMap<u64, Arc<BackingId>>,
    by_ino: HashMap<Ino, Weak<BackingId>>,
}

/// Drops the kernel's page cache of an inode once its backing file is
/// complete (see [`Filled`]), through the session's notifier. The call
/// comes from the filler's thread, never from a request handler, so it
/// cannot wait on a reply of its own. Drops behind a reader (see
/// [`Behind`]) are asked for by request handlers, so a thread of their own
/// makes them.
pub fn drop_cache_when_filled(hook: &Filled, behind: &Behind, notifier: fuser::Notifier) {
    let n = notifier.clone();
    let _ = hook.set(Box::new(move |ino| drop_cache(&n, ino, 0, 0)));
    let (tx, rx) = std::sync::mpsc::channel::<(u64, u64, u64)>();
    let spawned = std::thread::Builder::new()
        .name("zt-drop".into())
        .spawn(move || {
            for (ino, at, len) in rx {
                drop_cache(&notifier, ino, at, len);
            }
        });
    match spawned {
        Ok(_) => {
            let _ = behind.set(Box::new(move |ino, at, len| {
                let _ = tx.send((ino, at, len));
            }));
        }
        Err(e) => log::debug!("no thread to drop page cache behind readers: {e}"),
    }
}

/// A read that waits for another thread's decode, counted in
/// `.ztensor/stats` while it waits (the count goes down however the job
/// ends: answered, panicked or dropped unrun).
struct Waits(Arc<TensorFs>);

impl Waits {
    fn count(fs: &Arc<TensorFs>) -> Waits {
        let stats = fs.data().stats();
        Stats::add(&stats.reads_waited, 1);
        Stats::add(&stats.reads_waiting, 1);
        Waits(fs.clone())
    }
}

impl Drop for Waits {
    fn drop(&mut self) {
        self.0.data().stats().reads_waiting.fetch_sub(1, Relaxed);
    }
}

fn answer_read(fs: &TensorFs, i: Ino, fh: u64, offset: u64, size: u32, reply: ReplyData) {
    match fs.read(i, fh, offset, size) {
        Ok(bytes) => {
            let staged = if bytes.mapped() {
                super::staging::stage(&bytes, |out| bytes.copy_checked(out))
            } else {
                Ok(None)
            };
            match staged {
                Ok(Some(s)) => reply.data(&s),
                Ok(None) => reply.data(&bytes),
                // The page the copy met was gone: nothing of it is sent.
                Err(e) => return reply.error(err(e)),
            }
            fs.served(offset, bytes);
        }
        Err(e) => reply.error(err(e)),
    }
}

/// Drops `len` bytes at `at` of inode `ino`'s page cache (0: to the end).
fn drop_cache(notifier: &fuser::Notifier, ino: Ino, at: u64, len: u64) {
    let (Ok(at), Ok(len)) = (i64::try_from(at), i64::try_from(len)) else {
        return;
    };
    // ENOENT: the kernel has forgotten the inode, and its cache with it.
    if let Err(e) = notifier.inval_inode(INodeNo(ino), at, len)
        && e.raw_os_error() != Some(libc::ENOENT)
    {
        log::debug!("cannot drop the page cache of inode {ino}: {e}");
    }
}

impl Adapter {
    pub fn new(
        fs: TensorFs,
        uid: u32,
        gid: u32,
        time: SystemTime,
        max_read: u32,
        unmounted: Box<dyn Fn() -> bool + Send + Sync>,
        no_passthrough: Option<String>,
    ) -> Adapter {
        Adapter {
            fs: Arc::new(fs),
            waiting: Waiting::new(WAITING_READS),
            uid,
            gid,
            time,
            max_read,
            unmounted,
            no_passthrough,
            backing_ids: Mutex::default(),
        }
    }

    /// Asks the kernel for passthrough; says in the log which way files
    /// are served, and why.
    fn init_passthrough(&mut self, config: &mut KernelConfig) {
        let label = self.fs.data().catalog().label.clone();
        if let Some(why) = &self.no_passthrough {
            log::info!("{label}: every file is served through FUSE: {why}");
            return;
        }
        let offered = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok();
        if offered {
            self.fs.set_passthrough(true);
            log::info!(
                "{label}: passthrough is on: the kernel reads backed files (decoded tensors once \
                 decoded, a view that is the file itself) without the daemon"
            );
        } else {
            log::warn!(
                "{label}: every file is served through FUSE: this kernel offers no passthrough \
                 (Linux 6.9 or later with CONFIG_FUSE_PASSTHROUGH)"
            );
        }
    }

    /// The kernel's id for `ino`'s backing file, registered on first use.
    fn backing_id(
        &self,
        ino: Ino,
        fh: u64,
        file: &std::fs::File,
        reply: &ReplyOpen,
    ) -> std::io::Result<Arc<BackingId>> {
        let mut ids = super::lock(&self.backing_ids);
        let id = match ids.by_ino.get(&ino).and_then(Weak::upgrade) {
            Some(id) => id,
            None => {
                let id = Arc::new(reply.open_backing(file)?);
                ids.by_ino.insert(ino, Arc::downgrade(&id));
                id
            }
        };
        ids.by_fh.insert(fh, id.clone());
        Ok(id)
    }

    fn attr(&self, a: &Attr) -> FileAttr {
        FileAttr {
            ino: INodeNo(a.ino),
            size: a.size,
            blocks: a.size.div_ceil(512),
            atime: self.time,
            mtime: self.time,
            ctime: self.time,
            crtime: self.time,
            kind: match a.kind {
                Kind::Dir => FileType::Directory,
                Kind::File => FileType::RegularFile,
            },
            perm: a.perm,
            nlink: a.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 1 << 20,
            flags: 0,
        }
    }
}

/// How long the kernel may keep `a`: an hour (nothing changes), or not
/// at all for a live file, whose size each stat asks again.
fn ttl(a: &Attr) -> Duration {
    if a.live { Duration::ZERO } else { TTL }
}

fn ino(i: INodeNo) -> Ino {
    i.0
}

fn err(e: i32) -> Errno {
    Errno::from_i32(e)
}

impl Filesystem for Adapter {
    /// The session is over. When the kernel has let go of the mount (it was
    /// unmounted), exit here, before fuser 0.18 drops its mount handle: that
    /// drop unmounts the mountpoint *path* again (its "still mounted?" test
    /// is inverted, fixed upstream after 0.18.0), which would take down a
    /// new mount made there in the meantime. When the mount is still up, the
    /// session failed (a worker could not start): return, so that the drop
    /// unmounts it and the caller reports the error.
    fn destroy(&mut self) {
        if (self.unmounted)() {
            log::info!("unmounted; the session is over, exiting");
            crate::source::before_exit();
            log::logger().flush();
            std::process::exit(0);
        }
        log::info!("the session ended with the mount still up; unmounting it");
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.init_passthrough(config);
        // Readahead is raised on the mount's bdi after mounting (the kernel
        // offers only its current 128 KiB here), so this refusal is expected.
        let _ = config.set_max_readahead(self.max_read);
        if let Err(max) = config.set_max_write(self.max_read) {
            log::warn!(
                "the kernel refused max_read={}; requests stay at most {max} bytes",
                self.max_read
            );
        }
        // Direct I/O is the default only where np.memmap keeps working.
        if self.fs.serves_direct_io()
            && config
                .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
                .is_err()
        {
            log::warn!(
                "this kernel cannot mmap files opened with direct I/O (needs 6.6); serving through the page cache"
            );
            // No request has come yet, so nothing else holds the fs.
            match Arc::get_mut(&mut self.fs) {
                Some(fs) => fs.use_page_cache(),
                None => log::error!("cannot switch to the page cache: the mount is in use"),
            }
        }
        // Best effort: each is only an optimisation, refused by older kernels.
        for flag in [
            InitFlags::FUSE_ASYNC_READ,
            InitFlags::FUSE_ASYNC_DIO,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_MAX_PAGES,
            InitFlags::FUSE_CACHE_SYMLINKS,
        ] {
            let _ = config.add_capabilities(flag);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.fs.lookup(ino(parent), name) {
            Ok(a) => reply.entry(&ttl(&a), &self.attr(&a), Generation(0)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn getattr(&self, _req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino(i)) {
            Ok(a) => reply.attr(&ttl(&a), &self.attr(&a)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn open(&self, _req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write =
            !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY) || flags.0 & libc::O_TRUNC != 0;
        // Nothing is ever written: a close needs no FLUSH round trip.
        let flags = |mode| match mode {
            CacheMode::KeepCache => FopenFlags::FOPEN_KEEP_CACHE,
            CacheMode::DirectIo => FopenFlags::FOPEN_DIRECT_IO,
        } | FopenFlags::FOPEN_NOFLUSH;
        match self.fs.open(ino(i), write) {
            Ok((fh, Open::Served(mode))) => reply.opened(FileHandle(fh), flags(mode)),
            Ok((fh, Open::Backed(b))) => match self.backing_id(ino(i), fh, b.file(), &reply) {
                Ok(id) => reply.opened_passthrough(FileHandle(fh), FopenFlags::FOPEN_NOFLUSH, &id),
                Err(e) => {
                    let mode = self.fs.refused_backing(fh, &e);
                    reply.opened(FileHandle(fh), flags(mode))
                }
            },
            Err(e) => reply.error(err(e)),
        }
    }

    fn getxattr(&self, _req: &Request, i: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.fs.getxattr(ino(i), name) {
            Ok(v) => xattr_reply(reply, &v, size),
            Err(e) => reply.error(err(e)),
        }
    }

    fn listxattr(&self, _req: &Request, i: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.listxattr(ino(i)) {
            Ok(v) => xattr_reply(reply, &v, size),
            Err(e) => reply.error(err(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        i: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let (i, fh) = (ino(i), fh.0);
        // One that would wait for another thread's decode waits off the
        // workers, so that a decode that stalls holds only its readers.
        if self.fs.would_wait(i, offset, size) {
            let (fs, counted) = (self.fs.clone(), Waits::count(&self.fs));
            let job = Box::new(move || {
                let _counted = counted;
                answer_read(&fs, i, fh, offset, size, reply);
            });
            if let Err(job) = self.waiting.hand_off(job) {
                job();
            }
            return;
        }
        answer_read(&self.fs, i, fh, offset, size, reply);
    }

    fn release(
        &self,
        _req: &Request,
        i: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // The kernel has let go of the handle: its backing id may go (the
        // last one closes the kernel's reference to the backing file).
        {
            let mut ids = super::lock(&self.backing_ids);
            if ids.by_fh.remove(&fh.0).is_some()
                && ids
                    .by_ino
                    .get(&ino(i))
                    .is_some_and(|w| w.strong_count() == 0)
            {
                ids.by_ino.remove(&ino(i));
            }
        }
        self.fs.release(fh.0);
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn opendir(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.getattr(ino(i)) {
            Ok(a) if a.kind == Kind::Dir => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.fs.readdir(ino(i), offset, |next, child, kind, name| {
            let ft = if kind == Kind::Dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            reply.add(INodeNo(child), next, ft, name)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = self.fs.readdir(ino(i), offset, |next, child, _kind, name| {
            match self.fs.getattr(child) {
                Ok(a) => reply.add(
                    INodeNo(child),
                    next,
                    name,
                    &ttl(&a),
                    &self.attr(&a),
                    Generation(0),
                ),
                Err(_) => false,
            }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn statfs(&self, _req: &Request, _i: INodeNo, reply: ReplyStatfs) {
        let (blocks, files) = self.fs.statfs();
        reply.statfs(blocks, 0, 0, files, 0, 4096, 255, 4096);
    }

    // Requests the mount does not serve. fuser's defaults answer each with
    // ENOSYS and a "[Not Implemented]" warning, which floods the log (every
    // Python open() asks TCGETS). Each gets the errno a read-only file
    // system gives, and no log line. Most write-like requests never come
    // (the mount is read-only, and the kernel answers EROFS itself); they
    // are answered here in case a kernel asks anyway.

    /// ioctl: no command is served; ENOTTY is "not a terminal / no such
    /// ioctl", what isatty() and TCGETS expect.
    fn ioctl(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    /// poll: ENOSYS makes the kernel stop asking and report the file
    /// always ready, as for a regular file.
    fn poll(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _ph: fuser::PollNotifier,
        _events: fuser::PollEvents,
        _flags: fuser::PollFlags,
        reply: fuser::ReplyPoll,
    ) {
        reply.error(Errno::ENOSYS);
    }

    /// lseek (SEEK_DATA, SEEK_HOLE): ENOSYS makes the kernel answer them
    /// itself from then on, with the whole file as data (it has no holes).
    fn lseek(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: fuser::ReplyLseek,
    ) {
        reply.error(Errno::ENOSYS);
    }

    /// bmap is for file systems on block devices: ENOSYS, not asked again.
    fn bmap(&self, _req: &Request, _i: INodeNo, _bs: u32, _idx: u64, reply: fuser::ReplyBmap) {
        reply.error(Errno::ENOSYS);
    }

    /// Locks: the mount does not negotiate FUSE_POSIX_LOCKS, so the kernel
    /// keeps them itself and never asks; ENOSYS if one ever does.
    fn getlk(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        reply: fuser::ReplyLock,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn setlk(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        _sleep: bool,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    /// Nothing was written, so there is nothing to sync.
    fn fsync(&self, _req: &Request, _i: INodeNo, _fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _i: INodeNo, _fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    /// Reached only without default_permissions (never here): the kernel
    /// checks permissions itself. Writing is refused, anything else allowed.
    fn access(&self, _req: &Request, _i: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        if mask.contains(fuser::AccessFlags::W_OK) {
            reply.error(Errno::EROFS);
        } else {
            reply.ok();
        }
    }

    /// There are no symbolic links.
    fn readlink(&self, _req: &Request, _i: INodeNo, reply: ReplyData) {
        reply.error(Errno::EINVAL);
    }

    // Write-like requests: EROFS.

    fn setattr(
        &self,
        _req: &Request,
        _i: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(
        &self,
        _req: &Request,
        _i: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: fuser::ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _i: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn removexattr(&self, _req: &Request, _i: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    /// Its destination would be a file of this mount open for writing,
    /// which cannot exist.
    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: fuser::ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }
}

/// An xattr value or name list: its size when asked for with size 0, the
/// bytes when they fit, else ERANGE.
fn xattr_reply(reply: ReplyXattr, v: &[u8], size: u32) {
    if size == 0 {
        reply.size(v.len() as u32);
    } else if v.len() <= size as usize {
        reply.data(v);
    } else {
        reply.error(Errno::ERANGE);
    }
}
