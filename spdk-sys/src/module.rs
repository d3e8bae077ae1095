//! Static descriptors that SPDK keeps by address: a bdev module
//! (`struct spdk_bdev_module`) and an event subsystem (`struct spdk_subsystem`) with a
//! dependency. They are registered from ELF constructors, before SPDK starts, like
//! SPDK's own `SPDK_BDEV_MODULE_REGISTER` and `SPDK_SUBSYSTEM_REGISTER` macros. Also the
//! unregistration of a module's bdev, with a Rust callback.

use std::cell::UnsafeCell;
use std::ffi::{CStr, c_int, c_void};

use crate::ffi;
use crate::rpc::RpcError;

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
#[repr(transparent)]
pub struct BdevModule(UnsafeCell<ffi::spdk_bdev_module>);

// SAFETY: the descriptor is written only by `register` (once, from a constructor, before
// any SPDK thread exists) and afterwards only by SPDK under its own locking.
unsafe impl Sync for BdevModule {}

impl std::fmt::Debug for BdevModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BdevModule")
    }
}

impl BdevModule {
    /// An all-zero descriptor (no callbacks, no name): what C's static initialisers give.
    pub const fn new() -> Self {
        // SAFETY: every field of `spdk_bdev_module` is a pointer, an optional function
        // pointer, an integer, a bool or a C spinlock/list head, for which all-zero is
        // the valid "empty" value (C statics are zero-initialised the same way).
        BdevModule(UnsafeCell::new(unsafe { std::mem::zeroed() }))
    }

    pub fn as_ptr(&'static self) -> *mut ffi::spdk_bdev_module {
        self.0.get()
    }

    /// Fills the descriptor with `init` and adds it to SPDK's module list.
    ///
    /// # Safety
    /// Call once, from an ELF constructor (before SPDK initialises the bdev layer);
    /// `name` must name no other module.
    pub unsafe fn register(
        &'static self,
        name: &'static CStr,
        init: impl FnOnce(&mut ffi::spdk_bdev_module),
    ) {
        // SAFETY: per the contract above nothing else accesses the descriptor yet.
        let m = unsafe { &mut *self.0.get() };
        m.name = name.as_ptr();
        init(m);
        // SAFETY: the descriptor is 'static and filled.
        unsafe { ffi::spdk_bdev_module_list_add(self.0.get()) };
    }
}

impl Default for BdevModule {
    fn default() -> Self {
        Self::new()
    }
}

/// An event subsystem and its dependency on another subsystem, in a `static`.
pub struct Subsystem {
    subsystem: UnsafeCell<ffi::spdk_subsystem>,
    depend: UnsafeCell<ffi::spdk_subsystem_depend>,
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
            }
        }
    }

    /// Registers subsystem `name` (initialised after `depends_on`, finished before it)
    /// with its `init` and `fini` callbacks. `init` must end with
    /// `spdk_subsystem_init_next(rc)` and `fini` with `spdk_subsystem_fini_next()`.
    ///
    /// # Safety
    /// Call once, from an ELF constructor; `name` must name no other subsystem.
    pub unsafe fn register(
        &'static self,
        name: &'static CStr,
        depends_on: &'static CStr,
        init: unsafe extern "C" fn(),
        fini: unsafe extern "C" fn(),
    ) {
        // SAFETY: per the contract above nothing else accesses the descriptors yet.
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
