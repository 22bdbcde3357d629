using System.Reflection;
using System.Runtime.CompilerServices;

[assembly: AssemblyTitle("Kiln")]
[assembly: AssemblyVersion("0.2.0.0")]
// The tests pin the layouts of the internal structs (Native.cs) against kiln.h.
[assembly: InternalsVisibleTo("KilnTests")]
