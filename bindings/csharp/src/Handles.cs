// SafeHandles of the C handles. A child handle holds a reference on its parent's handle
// (DangerousAddRef) until it is released, so the finalizer or a Dispose out of order can never
// free a model under its cache or a cache under its sessions: kiln.h requires that order.
using System;
using System.Runtime.InteropServices;

namespace Kiln
{
    internal abstract class KilnHandle : SafeHandle
    {
        private SafeHandle _parent;

        protected KilnHandle() : base(IntPtr.Zero, true) { }

        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }

        internal void Adopt(IntPtr raw, SafeHandle parent)
        {
            if (parent != null)
            {
                bool added = false;
                parent.DangerousAddRef(ref added);
                _parent = parent;
            }
            SetHandle(raw);
        }

        protected abstract void Destroy(IntPtr raw);

        protected override bool ReleaseHandle()
        {
            Destroy(handle);
            if (_parent != null) _parent.DangerousRelease();
            return true;
        }
    }

    internal sealed class ModelHandle : KilnHandle
    {
        protected override void Destroy(IntPtr raw) { Native.kiln_model_destroy(raw); }
    }

    internal sealed class GgufHandle : KilnHandle
    {
        protected override void Destroy(IntPtr raw) { Native.kiln_gguf_destroy(raw); }
    }

    internal sealed class CacheHandle : KilnHandle
    {
        protected override void Destroy(IntPtr raw) { Native.kiln_cache_destroy(raw); }
    }

    internal sealed class SessionHandle : KilnHandle
    {
        // The delegates of the last submitted request: kiln may call them until the request is
        // done, at the latest inside kiln_session_destroy, so the handle (not the Session, which
        // the GC may collect first) keeps them alive.
        internal object RequestCallbacks;

        protected override void Destroy(IntPtr raw) { Native.kiln_session_destroy(raw); }
    }

    internal sealed class StrategyHandle : KilnHandle
    {
        protected override void Destroy(IntPtr raw) { Native.kiln_strategy_destroy(raw); }
    }
}
