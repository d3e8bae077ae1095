//! Static descriptors that SPDK keeps by address: a bdev module
//! (`struct spdk_bdev_module`) and an event subsystem (`struct spdk_subsystem`) with a
//! dependency. They are registered from an ELF constructor, before SPDK starts, like
//! SPDK's own `SPDK_BDEV_MODULE_REGISTER` and `SPDK_SUBSYSTEM_REGISTER` macros: a
//! plugin names its registration function with [`at_load!`](crate::at_load), which
//! hands it the [`Loading`] token that registration asks for. Also the unregistration
//! of a module's bdev, with a Rust callback.

use std::cell::UnsafeCell;
use std::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::ffi;
use crate::rpc::RpcError;

/// Proof that the caller runs inside the plugin's ELF constructor: at load time, once,
/// on the loading thread, before `main` and so before SPDK has any thread or has read
/// any of its module or subsystem lists. Only [`at_load!`](crate::at_load) makes one.
/// Neither `Send` nor `Sync`: it stays on the loading thread.
#[derive(Debug)]
pub struct Loading(std::marker::PhantomData<*const ()>);

impl Loading {
    /// # Safety
    /// Only from an ELF constructor (what [`at_load!`](crate::at_load) expands to).
    #[doc(hidden)]
    pub unsafe fn assume() -> Loading {
        Loading(std::marker::PhantomData)
    }
}

/// Runs `$f(&Loading)` once when the plugin is loaded, as an ELF constructor (not in
/// the crate's unit-test builds, nor in fuzz builds, where cargo-fuzz sets `--cfg
/// fuzzing`: tests and fuzz binaries must not register with SPDK).
#[macro_export]
macro_rules! at_load {
    ($f:path) => {
        #[cfg(not(any(test, fuzzing)))]
        #[used]
        #[unsafe(link_section = ".init_array")]
        static __SPDK_SYS_AT_LOAD: extern "C" fn() = {
            extern "C" fn at_load() {
                // SAFETY: this function is only referenced from `.init_array`, so it runs
                // once, as an ELF constructor.
                let loading = unsafe { $crate::module::Loading::assume() };
                $f(&loading)
            }
            at_load
        };
    };
}

/// Unregisters `bdev`; `done` gets the outcome once, as an RPC answer would carry it.
///
/// # Safety
/// Call on the app thread, with `bdev` registered by this process and not being
/// unregistered already.
pub unsafe fn unregister_bdev(
    bdev: *mut ffi::spdk_bdev,
    done: impl FnOnce(Result<(), RpcError>) + 'static,
) {
    type Done = Box<dyn FnOnce(Result<(), RpcError>)>;
    unsafe extern "C" fn unregistered(arg: *mut c_void, rc: c_int) {
        // SAFETY: `arg` is the boxed callback leaked below; SPDK calls this once.
        let done = unsafe { Box::from_raw(arg.cast::<Done>()) };
        done(if rc == 0 {
            Ok(())
        } else {
            Err(RpcError::new(
                rc,
                format!("bdev unregister failed: error {rc}"),
            ))
        });
    }
    let arg: Box<Done> = Box::new(Box::new(done));
    // SAFETY: per the contract above; the callback reclaims `arg`.
    unsafe { ffi::spdk_bdev_unregister(bdev, Some(unregistered), Box::into_raw(arg).cast()) };
}

/// A bdev module descriptor in a `static`. SPDK links it into its module list and
/// writes its internal fields (list links, spinlock); Rust code only fills it before
/// registration.
pub struct BdevModule {
    m: UnsafeCell<ffi::spdk_bdev_module>,
    registered: AtomicBool,
}

// SAFETY: the descriptor is written only by `register` (once, guarded by `registered`, at
// load time, before any SPDK thread exists) and afterwards only by SPDK under its own
// locking.
unsafe impl Sync for BdevModule {}

impl std::fmt::Debug for BdevModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BdevModule")
    }
}

impl BdevModule {
    /// An all-zero descriptor (no callbacks, no name): what C's static initialisers give.
    pub const fn new() -> Self {
        BdevModule {
            // SAFETY: every field of `spdk_bdev_module` is a pointer, an optional
            // function pointer, an integer, a bool or a C spinlock/list head, for which
            // all-zero is the valid "empty" value (C statics are zero-initialised the
            // same way).
            m: UnsafeCell::new(unsafe { std::mem::zeroed() }),
            registered: AtomicBool::new(false),
        }
    }

    pub fn as_ptr(&'static self) -> *mut ffi::spdk_bdev_module {
        self.m.get()
    }

    /// Fills the descriptor with `init` and adds it to SPDK's module list, at load
    /// time; a second call does nothing (and logs). SPDK refuses a name another module
    /// has at its init.
    pub(crate) fn register(
        &'static self,
        name: &'static CStr,
        _loading: &Loading,
        init: impl FnOnce(&mut ffi::spdk_bdev_module),
    ) {
        if self.registered.swap(true, Ordering::Relaxed) {
            tracing::error!("bdev module {name:?} registered twice; ignored");
            return;
        }
        // SAFETY: at load time nothing else runs (`Loading`), and this descriptor is
        // registered once (the flag above): nothing else accesses it yet.
        let m = unsafe { &mut *self.m.get() };
        m.name = name.as_ptr();
        init(m);
        // SAFETY: the descriptor is 'static and filled; SPDK reads its module list only
        // once it runs, after the constructors.
        unsafe { ffi::spdk_bdev_module_list_add(self.m.get()) };
    }
}

impl Default for BdevModule {
    fn default() -> Self {
        Self::new()
    }
}

/// An event subsystem: its descriptor, name, dependency and hooks.
pub trait SubsystemHooks: 'static {
    const NAME: &'static CStr;
    /// Initialised after this subsystem, finished before it.
    const DEPENDS_ON: &'static CStr;
    fn descriptor() -> &'static Subsystem;
    /// At the subsystem's init (nothing by default).
    fn init() {}
    /// At the subsystem's fini (nothing by default).
    fn fini() {}
}

unsafe extern "C" fn subsystem_init<S: SubsystemHooks>() {
    S::init();
    // SAFETY: the required continuation of a subsystem's init, once.
    unsafe { ffi::spdk_subsystem_init_next(0) };
}

unsafe extern "C" fn subsystem_fini<S: SubsystemHooks>() {
    S::fini();
    // SAFETY: the required continuation of a subsystem's fini, once.
    unsafe { ffi::spdk_subsystem_fini_next() };
}

/// Registers subsystem `S` at load time; a second call does nothing (and logs).
pub fn register_subsystem<S: SubsystemHooks>(loading: &Loading) {
    S::descriptor().register(
        S::NAME,
        S::DEPENDS_ON,
        subsystem_init::<S>,
        subsystem_fini::<S>,
        loading,
    );
}

/// An event subsystem and its dependency on another subsystem, in a `static`.
pub struct Subsystem {
    subsystem: UnsafeCell<ffi::spdk_subsystem>,
    depend: UnsafeCell<ffi::spdk_subsystem_depend>,
    registered: AtomicBool,
}

// SAFETY: as for `BdevModule`: written once from a constructor, then by SPDK only.
unsafe impl Sync for Subsystem {}

impl std::fmt::Debug for Subsystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Subsystem")
    }
}

impl Subsystem {
    pub const fn new() -> Self {
        // SAFETY: both structs hold only pointers, optional function pointers and list
        // links, for which all-zero is the valid empty value.
        unsafe {
            Subsystem {
                subsystem: UnsafeCell::new(std::mem::zeroed()),
                depend: UnsafeCell::new(std::mem::zeroed()),
                registered: AtomicBool::new(false),
            }
        }
    }

    /// Registers subsystem `name` (initialised after `depends_on`, finished before it)
    /// with its `init` and `fini` callbacks, which end with `spdk_subsystem_init_next`
    /// and `spdk_subsystem_fini_next`.
    fn register(
        &'static self,
        name: &'static CStr,
        depends_on: &'static CStr,
        init: unsafe extern "C" fn(),
        fini: unsafe extern "C" fn(),
        _loading: &Loading,
    ) {
        if self.registered.swap(true, Ordering::Relaxed) {
            tracing::error!("subsystem {name:?} registered twice; ignored");
            return;
        }
        // SAFETY: at load time nothing else runs (`Loading`) and these descriptors are
        // registered once (the flag above): nothing else accesses them yet. SPDK reads
        // its subsystem lists only once it runs.
        unsafe {
            let s = &mut *self.subsystem.get();
            s.name = name.as_ptr();
            s.init = Some(init);
            s.fini = Some(fini);
            let d = &mut *self.depend.get();
            d.name = name.as_ptr();
            d.depends_on = depends_on.as_ptr();
            ffi::spdk_add_subsystem(self.subsystem.get());
            ffi::spdk_add_subsystem_depend(self.depend.get());
        }
    }
}

impl Default for Subsystem {
    fn default() -> Self {
        Self::new()
    }
}
