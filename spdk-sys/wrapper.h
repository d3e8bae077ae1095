/* Headers bindgen reads. Only public SPDK API is bound, plus the event-subsystem
 * registration that SPDK v25.09 still declares in spdk_internal/init.h (it became public
 * in spdk/init.h in v26.05). */
#include <spdk/stdinc.h>
#include <spdk/env.h>
#include <spdk/log.h>
#include <spdk/thread.h>
#include <spdk/json.h>
#include <spdk/jsonrpc.h>
#include <spdk/rpc.h>
#include <spdk/uuid.h>
#include <spdk/nvme_spec.h>
#include <spdk/bdev.h>
#include <spdk/bdev_module.h>
#include <spdk/init.h>
#if __has_include(<spdk_internal/init.h>)
#include <spdk_internal/init.h>
#endif
