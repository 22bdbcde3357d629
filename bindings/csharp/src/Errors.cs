using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;
using System.Text;

namespace Kiln
{
    /// <summary>kiln_status: 0 is success, errors are positive and stable.</summary>
    public enum Status
    {
        Ok = 0,
        InvalidArgument = 1,
        IO = 2,
        Format = 3,
        Unsupported = 4,
        OutOfMemory = 5,
        CacheFull = 6,
        Cancelled = 7,
        OutOfRange = 8,
        BufferTooSmall = 9,
        Busy = 10,
        Internal = 11,
    }

    /// <summary>A failed kiln call: its status and kiln's message (what was wrong).</summary>
    public class KilnException : Exception
    {
        public Status Status { get; private set; }
        /// <summary>kiln_last_error_message() of the failed call.</summary>
        public string KilnMessage { get; private set; }

        public KilnException(Status status, string message)
            : base(Interop.StatusName(status) + (message.Length > 0 ? ": " + message : ""))
        {
            Status = status;
            KilnMessage = message;
        }
    }

    /// <summary>A call stopped through its CancellationToken (also a KilnException with
    /// Status.Cancelled, so either catch works).</summary>
    public sealed class KilnCancelledException : KilnException
    {
        public KilnCancelledException(string message) : base(Status.Cancelled, message) { }
    }

    internal static class Interop
    {
        internal static string StatusName(Status status)
        {
            return Marshal.PtrToStringAnsi(Native.kiln_status_name((int)status));
        }

        // kiln's message is per native thread; a P/Invoke runs on the calling thread, so reading it
        // right after the failed call on the same thread is exact.
        internal static void Check(int status)
        {
            if (status != 0) throw Error(status);
        }

        internal static KilnException Error(int status)
        {
            return new KilnException((Status)status, Utf8String(Native.kiln_last_error_message()));
        }

        internal static string Utf8String(IntPtr p)
        {
            if (p == IntPtr.Zero) return "";
            int n = 0;
            while (Marshal.ReadByte(p, n) != 0) n++;
            var bytes = new byte[n];
            Marshal.Copy(p, bytes, 0, n);
            return Encoding.UTF8.GetString(bytes);
        }

        internal delegate int MetaAt(UIntPtr index, out IntPtr key, out IntPtr value);

        /// <summary>The n (key, value) metadata entries that at reads (kiln_model_meta_at,
        /// kiln_gguf_meta_at): strings owned by the handle, copied here.</summary>
        internal static IList<KeyValuePair<string, string>> MetaEntries(int n, MetaAt at)
        {
            var entries = new List<KeyValuePair<string, string>>(n);
            for (int i = 0; i < n; i++)
            {
                IntPtr key, value;
                Check(at((UIntPtr)i, out key, out value));
                entries.Add(new KeyValuePair<string, string>(Utf8String(key), Utf8String(value)));
            }
            return entries;
        }

        /// <summary>NUL-terminated UTF-8 (null for null).</summary>
        internal static byte[] CString(string s)
        {
            if (s == null) return null;
            var bytes = new byte[Encoding.UTF8.GetByteCount(s) + 1];
            Encoding.UTF8.GetBytes(s, 0, s.Length, bytes, 0);
            return bytes;
        }

        /// <summary>A NUL-terminated UTF-8 copy in unmanaged memory (free with FreeHGlobal).</summary>
        internal static IntPtr AllocCString(string s)
        {
            byte[] bytes = CString(s);
            IntPtr p = Marshal.AllocHGlobal(bytes.Length);
            Marshal.Copy(bytes, 0, p, bytes.Length);
            return p;
        }

        /// <summary>An unmanaged array of unmanaged C strings; null for none.</summary>
        internal sealed class CStringArray : IDisposable
        {
            private readonly IntPtr[] _strings;
            public IntPtr Pointer { get; private set; }
            public int Count { get { return _strings.Length; } }

            public CStringArray(string[] strings)
            {
                _strings = new IntPtr[strings == null ? 0 : strings.Length];
                if (_strings.Length == 0) return;
                Pointer = Marshal.AllocHGlobal(IntPtr.Size * _strings.Length);
                for (int i = 0; i < _strings.Length; i++)
                {
                    _strings[i] = AllocCString(strings[i]);
                    Marshal.WriteIntPtr(Pointer, i * IntPtr.Size, _strings[i]);
                }
            }

            public void Dispose()
            {
                foreach (IntPtr p in _strings) Marshal.FreeHGlobal(p);
                if (Pointer != IntPtr.Zero) Marshal.FreeHGlobal(Pointer);
                Pointer = IntPtr.Zero;
            }
        }
    }
}
